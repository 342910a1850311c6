package ctl

// bashCompletion completes shardmqctl's commands, subcommands and flags;
// job ids come from the router (shardmqctl -json reshard status).
const bashCompletion = `# bash completion for shardmqctl: source <(shardmqctl completion bash)
_shardmqctl() {
    local cur prev words cword
    cur="${COMP_WORDS[COMP_CWORD]}"
    prev="${COMP_WORDS[COMP_CWORD-1]}"
    local i cmd="" sub="" n=0
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${COMP_WORDS[i]}" in
            -router|-token|-token-file) ((i++)) ;;
            -*) ;;
            *) if [[ -z $cmd ]]; then cmd="${COMP_WORDS[i]}"; elif [[ -z $sub ]]; then sub="${COMP_WORDS[i]}"; fi; ((n++)) ;;
        esac
    done
    if [[ $cur == -* ]]; then
        local flags="-router -token -token-file -json -yes --help"
        case "$cmd $sub" in
            "shardmap "*) flags="$flags -heat" ;;
            "trace "*) flags="$flags -topic -order-key" ;;
            "reconcile "*) flags="$flags -tx" ;;
            "sub put") flags="$flags -config" ;;
            "dlq list") flags="$flags -error-code -limit -cursor" ;;
            "dlq redrive") flags="$flags -ids -error-code -all -dry-run" ;;
            "dlq purge") flags="$flags -error-code" ;;
            "archive restore"|"archive release") flags="$flags -month" ;;
            "reshard start") flags="$flags -follow" ;;
            "reshard status") flags="$flags -watch" ;;
            "reshard move"|"reshard add-cluster"|"reshard drain") flags="$flags -dry-run" ;;
            "token new") flags="-name -produce -consume -admin -tokens -out" ;;
        esac
        COMPREPLY=($(compgen -W "$flags" -- "$cur"))
        return
    fi
    case $n in
        0) COMPREPLY=($(compgen -W "help topology shardmap stats trace tx reconcile sub dlq reshard archive completion token aws-key" -- "$cur")) ;;
        1) case $cmd in
               sub) COMPREPLY=($(compgen -W "get put delete" -- "$cur")) ;;
               dlq) COMPREPLY=($(compgen -W "list codes redrive purge" -- "$cur")) ;;
               archive) COMPREPLY=($(compgen -W "status run restore release" -- "$cur")) ;;
               reshard) COMPREPLY=($(compgen -W "plan start status pause resume abort move add-cluster drain" -- "$cur")) ;;
               completion) COMPREPLY=($(compgen -W "bash" -- "$cur")) ;;
               token|aws-key) COMPREPLY=($(compgen -W "new" -- "$cur")) ;;
               help) COMPREPLY=($(compgen -W "topology shardmap stats trace tx reconcile sub dlq reshard archive completion token aws-key" -- "$cur")) ;;
           esac ;;
        2) case "$cmd $sub" in
               "reshard plan"|"reshard start") COMPREPLY=($(compgen -W "move add-cluster drain" -- "$cur")) ;;
               "reshard status"|"reshard pause"|"reshard resume"|"reshard abort")
                   local jobs
                   jobs=$(shardmqctl -json reshard status 2>/dev/null | sed -n 's/^ *"job": "\(.*\)",$/\1/p')
                   COMPREPLY=($(compgen -W "$jobs" -- "$cur")) ;;
           esac ;;
    esac
}
complete -F _shardmqctl shardmqctl
`
