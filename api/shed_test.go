package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// TestShedAnswers503Overloaded: beyond max requests in flight the router
// answers 503 overloaded with Retry-After at once; /healthz still passes,
// and once a request finishes the next one is served.
func TestShedAnswers503Overloaded(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}), make(chan struct{})
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			entered <- struct{}{}
			<-release
		}
		w.WriteHeader(http.StatusOK)
	})
	s := NewShed(slow, 2, nil)
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := httptest.NewRecorder()
			s.ServeHTTP(rec, httptest.NewRequest("GET", "/slow", nil))
			if rec.Code != http.StatusOK {
				t.Errorf("request within the cap: %d", rec.Code)
			}
		}()
		<-entered
	}
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/ack", nil))
	var body struct {
		Error apiError `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != http.StatusServiceUnavailable ||
		body.Error.Code != CodeOverloaded || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("over the cap: %d %q %s", rec.Code, rec.Header().Get("Retry-After"), rec.Body.String())
	}
	rec = httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/healthz shed: %d", rec.Code)
	}
	close(release)
	wg.Wait()
	rec = httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest("GET", "/fast", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("after the slow ones finished: %d", rec.Code)
	}
}
