package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
)

// Prefix is where the console is served.
const Prefix = "/ui/"

// sessionCookie holds a logged-in browser's bearer token.
const sessionCookie = "norn_session"

// Login rate limit, per client address: loginBurst attempts at once, then
// one per loginEvery.
const (
	loginEvery = 6 * time.Second
	loginBurst = 5
	// maxLimiters bounds the addresses remembered; past it the oldest
	// half is forgotten.
	maxLimiters = 10000
)

// Config is what the console needs from the node.
type Config struct {
	// API is the node's API handler (TaskService, AdminService,
	// QueueService, with their checks): the console calls it in process.
	API http.Handler
	// AuthOn: the node checks its callers (TLS or an access file), so a
	// browser without a client certificate must log in with a token.
	AuthOn bool
	// CertUser names the user of a request's verified client
	// certificate ("" for none): the node's own check (transport's),
	// since the handshake may leave the chain to it.
	CertUser func(r *http.Request) string
	// NodeID names the node in the page titles.
	NodeID string
	// Logger, for what the console itself refuses (logins).
	Logger *slog.Logger
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
	// Metrics is the node's registry, whose RPC metrics the overview
	// charts (sparks.go); nil: no charts. Close stops its sampling.
	Metrics prometheus.Gatherer
	// SampleEvery is the interval of the charts' points; 0 means 10 s.
	SampleEvery time.Duration
}

//go:embed templates/*.html static/*
var assets embed.FS

// Console serves the pages. Safe for concurrent use.
type Console struct {
	cfg    Config
	secret []byte // the CSRF key, new at every start
	pages  map[string]*template.Template
	static http.Handler
	mux    *http.ServeMux
	sparks *sampler // nil without Config.Metrics

	mu       sync.Mutex
	limiters map[string]*limiter
}

type limiter struct {
	l    *rate.Limiter
	used time.Time
}

// New returns the console of cfg. With cfg.Metrics it samples them in a
// goroutine of its own until Close.
func New(cfg Config) *Console {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	c := &Console{cfg: cfg, secret: make([]byte, 32), limiters: map[string]*limiter{}}
	rand.Read(c.secret) //nolint:errcheck // crypto/rand.Read never fails (Go 1.24+)
	c.pages = parsePages()
	sub, _ := fs.Sub(assets, "static")
	c.static = http.StripPrefix(Prefix+"static/", http.FileServerFS(sub))
	m := http.NewServeMux()
	m.Handle("GET "+Prefix+"static/", c.static)
	m.HandleFunc("GET "+Prefix+"login", c.loginPage)
	m.HandleFunc("POST "+Prefix+"login", c.login)
	m.HandleFunc("POST "+Prefix+"logout", c.action(c.logout))
	m.HandleFunc("GET "+Prefix+"{$}", c.page(c.overview))
	m.HandleFunc("GET "+Prefix+"queues", c.page(c.queues))
	m.HandleFunc("POST "+Prefix+"queues/{queue}/pause", c.action(c.pause))
	m.HandleFunc("GET "+Prefix+"tasks", c.page(c.tasks))
	m.HandleFunc("GET "+Prefix+"tasks/{id}", c.page(c.task))
	m.HandleFunc("GET "+Prefix+"find", c.find)
	m.HandleFunc("GET "+Prefix+"workers", c.page(c.workers))
	m.HandleFunc("GET "+Prefix+"dead", c.page(c.dead))
	m.HandleFunc("POST "+Prefix+"dead", c.action(c.deadAct))
	m.HandleFunc("GET "+Prefix+"schedules", c.page(c.schedules))
	m.HandleFunc("GET "+Prefix+"schedules/new", c.page(c.scheduleNew))
	m.HandleFunc("GET "+Prefix+"schedules/{name}/edit", c.page(c.scheduleEdit))
	m.HandleFunc("POST "+Prefix+"schedules", c.formPost(c.scheduleCreate))
	m.HandleFunc("POST "+Prefix+"schedules/{name}", c.formPost(c.scheduleUpdate))
	m.HandleFunc("POST "+Prefix+"schedules/{name}/delete", c.action(c.scheduleDelete))
	m.HandleFunc("POST "+Prefix+"schedules/{name}/pause", c.action(c.schedulePause))
	m.HandleFunc("POST "+Prefix+"schedules/{name}/trigger", c.action(c.scheduleTrigger))
	m.HandleFunc("GET "+Prefix+"cluster", c.page(c.cluster))
	m.HandleFunc("POST "+Prefix+"cluster/rebalance", c.action(c.rebalance))
	m.HandleFunc("POST "+Prefix+"cluster/drain", c.action(c.drain))
	m.HandleFunc("POST "+Prefix+"tasks/{id}/{act}", c.action(c.act))
	c.mux = m
	if cfg.Metrics != nil {
		c.sparks = newSampler(cfg.Metrics, cfg.SampleEvery)
		c.sparks.start()
	}
	return c
}

// Close stops the console's sampling of the metrics and waits for it to
// end. It may be called more than once; the pages are still served.
func (c *Console) Close() {
	if c.sparks != nil {
		c.sparks.close()
	}
}

// ServeHTTP serves the console's paths (Prefix and below).
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	// No framing by other sites (clickjacking), no sniffing, no referrer
	// leaving the console, and scripts and styles from the console only.
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'")
	c.mux.ServeHTTP(w, r)
}

// session is who a browser is to the console.
type session struct {
	token string // from the cookie; "" with a client certificate or without access control
	key   string // what the CSRF token is made from
}

// sessionOf returns r's session, and whether it has one: a session
// cookie, a verified client certificate, or no access control at all.
func (c *Console) sessionOf(r *http.Request) (session, bool) {
	if ck, err := r.Cookie(sessionCookie); err == nil && ck.Value != "" {
		return session{token: ck.Value, key: "token:" + ck.Value}, true
	}
	if c.cfg.CertUser != nil && r.TLS != nil && len(r.TLS.PeerCertificates) > 0 && c.cfg.CertUser(r) != "" {
		sum := sha256.Sum256(r.TLS.PeerCertificates[0].Raw)
		return session{key: "cert:" + string(sum[:])}, true
	}
	if !c.cfg.AuthOn {
		return session{key: "open"}, true
	}
	return session{}, false
}

// csrf is the CSRF token of s: an HMAC of its key under the process's
// secret, so that only a page this node served to s carries it.
func (c *Console) csrf(s session) string {
	m := hmac.New(sha256.New, c.secret)
	m.Write([]byte(s.key))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// checkAction refuses a POST without r's session's CSRF token, or from
// another origin.
func (c *Console) checkAction(r *http.Request, s session) bool {
	if o := r.Header.Get("Origin"); o != "" && !sameOrigin(o, r.Host) {
		return false
	}
	got := r.PostFormValue("csrf")
	return got != "" && hmac.Equal([]byte(got), []byte(c.csrf(s)))
}

// sameOrigin reports whether origin (scheme://host[:port]) names host.
func sameOrigin(origin, host string) bool {
	_, rest, ok := strings.Cut(origin, "://")
	return ok && strings.EqualFold(rest, host)
}

// allowLogin takes one login attempt from r's address from its bucket.
func (c *Console) allowLogin(r *http.Request) bool {
	addr, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		addr = r.RemoteAddr
	}
	now := c.cfg.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.limiters[addr]
	if l == nil {
		if len(c.limiters) >= maxLimiters {
			c.forgetOldest()
		}
		l = &limiter{l: rate.NewLimiter(rate.Every(loginEvery), loginBurst)}
		c.limiters[addr] = l
	}
	l.used = now
	return l.l.AllowN(now, 1)
}

// forgetOldest drops the half of the limiters used longest ago.
func (c *Console) forgetOldest() {
	var times []time.Time
	for _, l := range c.limiters {
		times = append(times, l.used)
	}
	slices.SortFunc(times, time.Time.Compare)
	cut := times[len(times)/2]
	for a, l := range c.limiters {
		if l.used.Before(cut) {
			delete(c.limiters, a)
		}
	}
}
