package console

import (
	"context"
	"net/http"
	"net/url"
	"strings"

	"connectrpc.com/connect"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// loginPage shows the token form (or goes on, for a browser that needs
// no login).
func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	if _, ok := c.sessionOf(r); ok && r.URL.Query().Get("error") == "" {
		http.Redirect(w, r, nextPage(r.URL.Query().Get("next")), http.StatusSeeOther)
		return
	}
	v := &view{Title: "Log in", Node: c.cfg.NodeID, Data: struct{ Next string }{r.URL.Query().Get("next")}}
	if e := r.URL.Query().Get("error"); e != "" {
		v.Errors = append(v.Errors, e)
	}
	c.render(w, "login", v)
}

// login takes a bearer token: rate limited per address, checked with
// WhoAmI, then kept in the session cookie.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	next := r.PostFormValue("next")
	fail := func(status int, msg string) {
		c.cfg.Logger.Warn("console: login refused", "remote", r.RemoteAddr, "why", msg)
		v := &view{Title: "Log in", Node: c.cfg.NodeID, Errors: []string{msg}, Data: struct{ Next string }{next}}
		w.WriteHeader(status)
		c.render(w, "login", v)
	}
	if o := r.Header.Get("Origin"); o != "" && !sameOrigin(o, r.Host) {
		fail(http.StatusForbidden, "refused: the login form came from another site")
		return
	}
	if !c.allowLogin(r) {
		w.Header().Set("Retry-After", "6")
		fail(http.StatusTooManyRequests, "too many login attempts from your address: wait a few seconds and try again")
		return
	}
	token := strings.TrimSpace(r.PostFormValue("token"))
	if token == "" {
		fail(http.StatusBadRequest, "token: required (nornctl token create <user>)")
		return
	}
	api := c.clientsFor(r, session{token: token})
	me, err := api.admin.WhoAmI(context.WithoutCancel(r.Context()), connect.NewRequest(&nornv1.WhoAmIRequest{}))
	if err != nil {
		status := http.StatusUnauthorized
		if connect.CodeOf(err) != connect.CodeUnauthenticated {
			status = http.StatusServiceUnavailable
		}
		fail(status, "token: "+errText(err))
		return
	}
	if !me.Msg.AccessControl {
		fail(http.StatusBadRequest, "this node takes no tokens (no access file): your client certificate is your login")
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: token, Path: Prefix, Secure: true, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, nextPage(next), http.StatusSeeOther)
}

// logout forgets the session cookie.
func (c *Console) logout(_ context.Context, w http.ResponseWriter, _ *http.Request, _ clients) (string, error) {
	clearSession(w)
	return Prefix + "login", nil
}

// clearSession deletes the session cookie.
func clearSession(w http.ResponseWriter) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: Prefix, MaxAge: -1, Secure: true, HttpOnly: true, SameSite: http.SameSiteStrictMode})
}

// nextPage is where a login goes on to: a console path only (never
// another site).
func nextPage(next string) string {
	u, err := url.Parse(next)
	if err != nil || next == "" || u.Scheme != "" || u.Host != "" || !strings.HasPrefix(u.Path, Prefix) || strings.HasPrefix(next, "//") {
		return Prefix
	}
	return u.RequestURI()
}
