#!/usr/bin/env bash
# The README's SQS walk-through with Debian's AWS CLI (query protocol):
# create-queue, send-message, receive-message --wait-time-seconds 5,
# delete-message, then the refusals of a wrong secret and of a
# produce-only key receiving. Run by TestQueryProtocolClients with
# SQS_ENDPOINT and AWS_SHARED_CREDENTIALS_FILE (profiles default and
# producer) set.
set -euo pipefail
aws() { /usr/bin/aws --endpoint-url "$SQS_ENDPOINT" "$@"; }
fail() { echo "e2e.sh: $*" >&2; exit 1; }

url=$(aws sqs create-queue --queue-name cli-orders --query QueueUrl --output text)
[[ $url == */000000000000/cli-orders ]] || fail "queue URL $url"
id=$(aws sqs send-message --queue-url "$url" --message-body '{"order":42}' --query MessageId --output text)
IFS=$'\t' read -r got_id handle body < <(aws sqs receive-message --queue-url "$url" --wait-time-seconds 5 \
	--query 'Messages[0].[MessageId,ReceiptHandle,Body]' --output text)
[[ $got_id == "$id" && $body == '{"order":42}' ]] || fail "received $got_id $body, sent $id"
aws sqs delete-message --queue-url "$url" --receipt-handle "$handle"
left=$(aws sqs get-queue-attributes --queue-url "$url" --attribute-names ApproximateNumberOfMessages ApproximateNumberOfMessagesNotVisible \
	--query '[Attributes.ApproximateNumberOfMessages,Attributes.ApproximateNumberOfMessagesNotVisible]' --output text)
[[ $left == $'0\t0' ]] || fail "left after delete: $left"

key=$(sed -n 's/^aws_access_key_id = //p' "$AWS_SHARED_CREDENTIALS_FILE" | head -1)
if err=$(AWS_ACCESS_KEY_ID=$key AWS_SECRET_ACCESS_KEY=wrongwrongwrongwrongwrongwrongwrongwrong aws sqs list-queues 2>&1); then
	fail "a wrong secret was served: $err"
fi
[[ $err == *SignatureDoesNotMatch* ]] || fail "wrong secret: $err"
aws --profile producer sqs send-message --queue-url "$url" --message-body p >/dev/null
if err=$(aws --profile producer sqs receive-message --queue-url "$url" 2>&1); then
	fail "a produce-only key received: $err"
fi
[[ $err == *AccessDenied* ]] || fail "produce-only receive: $err"
echo "e2e.sh: ok"
