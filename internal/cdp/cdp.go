// Package cdp drives a headless Chromium over the DevTools protocol on a
// pipe (--remote-debugging-pipe: commands on the browser's fd 3, answers
// and events on its fd 4, each a JSON object ended by a NUL byte), which
// needs no WebSocket and no port. It has what the operators' page test
// needs: open a page, evaluate JavaScript, wait for a condition, collect
// console errors, take a screenshot. Tests only; nothing in the router
// uses it.
package cdp

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// Find returns the path of a Chromium binary: $SHARDMQ_CHROMIUM, else
// Debian's chromium package (its binary, not the wrapper script), else
// chromium or chromium-browser on PATH; "" when there is none.
func Find() string {
	if p := os.Getenv("SHARDMQ_CHROMIUM"); p != "" {
		return p
	}
	if st, err := os.Stat("/usr/lib/chromium/chromium"); err == nil && !st.IsDir() {
		return "/usr/lib/chromium/chromium"
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// Browser is one headless Chromium process.
type Browser struct {
	cmd  *exec.Cmd
	w    *os.File
	done chan struct{}

	mu      sync.Mutex
	next    int64
	pending map[int64]chan message
	onEvent func(session, method string, params json.RawMessage)
	err     error // the read loop's end
}

type message struct {
	ID        int64           `json:"id,omitempty"`
	SessionID string          `json:"sessionId,omitempty"`
	Method    string          `json:"method,omitempty"`
	Params    json.RawMessage `json:"params,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	Error     *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

// Launch starts Chromium headless with a fresh profile in dir and a
// window of width×height pixels. onEvent receives every event (from the
// read loop: it must not block).
func Launch(path, dir string, width, height int, onEvent func(session, method string, params json.RawMessage)) (*Browser, error) {
	toBrowser, ourW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	ourR, fromBrowser, err := os.Pipe()
	if err != nil {
		toBrowser.Close()
		ourW.Close()
		return nil, err
	}
	cmd := exec.Command(path, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
		"--user-data-dir="+dir, "--no-first-run", "--no-default-browser-check", "--disable-extensions",
		"--disable-background-networking", "--disable-sync", "--disable-dev-shm-usage", "--hide-scrollbars",
		"--mute-audio", fmt.Sprintf("--window-size=%d,%d", width, height), "about:blank")
	cmd.ExtraFiles = []*os.File{toBrowser, fromBrowser} // fd 3, fd 4
	if err := cmd.Start(); err != nil {
		for _, f := range []*os.File{toBrowser, ourW, ourR, fromBrowser} {
			f.Close()
		}
		return nil, fmt.Errorf("start %s: %w", path, err)
	}
	toBrowser.Close()
	fromBrowser.Close()
	b := &Browser{cmd: cmd, w: ourW, done: make(chan struct{}), pending: map[int64]chan message{}, onEvent: onEvent}
	go b.read(ourR)
	return b, nil
}

func (b *Browser) read(r *os.File) {
	defer close(b.done)
	defer r.Close()
	br := bufio.NewReaderSize(r, 1<<20)
	for {
		data, err := br.ReadBytes(0)
		if err != nil {
			b.mu.Lock()
			b.err = fmt.Errorf("browser pipe: %w", err)
			for id, ch := range b.pending {
				close(ch)
				delete(b.pending, id)
			}
			b.mu.Unlock()
			return
		}
		var m message
		if err := json.Unmarshal(data[:len(data)-1], &m); err != nil {
			continue
		}
		if m.ID != 0 {
			b.mu.Lock()
			ch := b.pending[m.ID]
			delete(b.pending, m.ID)
			b.mu.Unlock()
			if ch != nil {
				ch <- m
			}
			continue
		}
		if b.onEvent != nil {
			b.onEvent(m.SessionID, m.Method, m.Params)
		}
	}
}

// Call sends one command (to the browser when session is "", else to an
// attached target) and decodes its result into result (may be nil).
func (b *Browser) Call(ctx context.Context, session, method string, params, result any) error {
	ch := make(chan message, 1)
	b.mu.Lock()
	if b.err != nil {
		err := b.err
		b.mu.Unlock()
		return err
	}
	b.next++
	id := b.next
	b.pending[id] = ch
	b.mu.Unlock()
	if params == nil {
		params = struct{}{}
	}
	p, err := json.Marshal(params)
	if err != nil {
		return err
	}
	data, err := json.Marshal(message{ID: id, SessionID: session, Method: method, Params: p})
	if err != nil {
		return err
	}
	if _, err := b.w.Write(append(data, 0)); err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	select {
	case <-ctx.Done():
		b.mu.Lock()
		delete(b.pending, id)
		b.mu.Unlock()
		return fmt.Errorf("%s: %w", method, ctx.Err())
	case m, ok := <-ch:
		if !ok {
			return fmt.Errorf("%s: the browser went away", method)
		}
		if m.Error != nil {
			return fmt.Errorf("%s: %s (%d)", method, m.Error.Message, m.Error.Code)
		}
		if result != nil {
			return json.Unmarshal(m.Result, result)
		}
		return nil
	}
}

// Close ends the browser and waits for it.
func (b *Browser) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b.Call(ctx, "", "Browser.close", nil, nil)
	b.w.Close()
	select {
	case <-b.done:
	case <-ctx.Done():
		b.cmd.Process.Kill()
	}
	return b.cmd.Wait()
}

// Page is one tab, attached with its own session.
type Page struct {
	b       *Browser
	Session string
}

// NewPage opens a blank tab and enables the runtime, log and page domains
// on it (their events reach onEvent).
func (b *Browser) NewPage(ctx context.Context) (*Page, error) {
	var t struct {
		TargetID string `json:"targetId"`
	}
	if err := b.Call(ctx, "", "Target.createTarget", map[string]any{"url": "about:blank"}, &t); err != nil {
		return nil, err
	}
	var a struct {
		SessionID string `json:"sessionId"`
	}
	if err := b.Call(ctx, "", "Target.attachToTarget", map[string]any{"targetId": t.TargetID, "flatten": true}, &a); err != nil {
		return nil, err
	}
	p := &Page{b: b, Session: a.SessionID}
	for _, m := range []string{"Runtime.enable", "Log.enable", "Page.enable"} {
		if err := b.Call(ctx, p.Session, m, nil, nil); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Navigate loads url and waits until its document is complete.
func (p *Page) Navigate(ctx context.Context, url string) error {
	var r struct {
		ErrorText string `json:"errorText"`
	}
	if err := p.b.Call(ctx, p.Session, "Page.navigate", map[string]any{"url": url}, &r); err != nil {
		return err
	}
	if r.ErrorText != "" {
		return fmt.Errorf("navigate %s: %s", url, r.ErrorText)
	}
	return p.WaitFor(ctx, `document.readyState === "complete"`)
}

// Eval evaluates a JavaScript expression (awaiting a promise) and decodes
// its value into out (may be nil). An exception is an error.
func (p *Page) Eval(ctx context.Context, expr string, out any) error {
	var r struct {
		Result struct {
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		Exception *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	err := p.b.Call(ctx, p.Session, "Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true, "awaitPromise": true}, &r)
	if err != nil {
		return err
	}
	if r.Exception != nil {
		return fmt.Errorf("evaluate %q: %s %s", expr, r.Exception.Text, r.Exception.Exception.Description)
	}
	if out != nil && len(r.Result.Value) > 0 {
		return json.Unmarshal(r.Result.Value, out)
	}
	return nil
}

// WaitFor evaluates expr every 50 ms until it is true, or ctx ends; the
// error then says what expr last gave.
func (p *Page) WaitFor(ctx context.Context, expr string) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	var last string
	for {
		var v any
		err := p.Eval(ctx, expr, &v)
		if err == nil && v == true {
			return nil
		}
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprint(v)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last: %s)", expr, ctx.Err(), last)
		case <-t.C:
		}
	}
}

// Screenshot is a PNG of the whole page.
func (p *Page) Screenshot(ctx context.Context) ([]byte, error) {
	var size struct {
		W float64 `json:"w"`
		H float64 `json:"h"`
	}
	if err := p.Eval(ctx, `({w: document.documentElement.scrollWidth, h: document.documentElement.scrollHeight})`, &size); err != nil {
		return nil, err
	}
	var r struct {
		Data string `json:"data"`
	}
	err := p.b.Call(ctx, p.Session, "Page.captureScreenshot", map[string]any{"format": "png", "captureBeyondViewport": true,
		"clip": map[string]any{"x": 0, "y": 0, "width": size.W, "height": size.H, "scale": 1}}, &r)
	if err != nil {
		return nil, err
	}
	if r.Data == "" {
		return nil, errors.New("screenshot: empty answer")
	}
	return base64.StdEncoding.DecodeString(r.Data)
}

// ConsoleProblem turns an event into a line when it reports an error or
// warning the page made (console.error/warn, an uncaught exception, a
// failed load or a refused policy in the browser's log); "" otherwise.
func ConsoleProblem(method string, params json.RawMessage) string {
	switch method {
	case "Runtime.consoleAPICalled":
		var e struct {
			Type string `json:"type"`
			Args []struct {
				Value       any    `json:"value"`
				Description string `json:"description"`
			} `json:"args"`
		}
		json.Unmarshal(params, &e)
		if e.Type != "error" && e.Type != "warning" && e.Type != "assert" {
			return ""
		}
		var parts []string
		for _, a := range e.Args {
			if a.Description != "" {
				parts = append(parts, a.Description)
			} else {
				parts = append(parts, fmt.Sprint(a.Value))
			}
		}
		return "console." + e.Type + ": " + strings.Join(parts, " ")
	case "Runtime.exceptionThrown":
		var e struct {
			Details struct {
				Text      string `json:"text"`
				Exception struct {
					Description string `json:"description"`
				} `json:"exception"`
			} `json:"exceptionDetails"`
		}
		json.Unmarshal(params, &e)
		return "exception: " + e.Details.Text + " " + e.Details.Exception.Description
	case "Log.entryAdded":
		var e struct {
			Entry struct {
				Level  string `json:"level"`
				Source string `json:"source"`
				Text   string `json:"text"`
				URL    string `json:"url"`
			} `json:"entry"`
		}
		json.Unmarshal(params, &e)
		if e.Entry.Level != "error" && e.Entry.Level != "warning" {
			return ""
		}
		return "log " + e.Entry.Level + " (" + e.Entry.Source + "): " + e.Entry.Text + " " + e.Entry.URL
	}
	return ""
}
