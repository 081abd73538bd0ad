package access

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/norn-dev/norn/transport"
)

// Roles a grant gives (docs/SECURITY.md).
const (
	// RoleAdmin may call everything: AdminService and every TaskService
	// method, on every queue it is granted.
	RoleAdmin = "admin"
	// RoleProducer may Enqueue, EnqueueBatch, GetTask, ListTasks,
	// CountTasks and Cancel.
	RoleProducer = "producer"
	// RoleWorker may Claim, Renew, Update, Complete, CompleteBatch,
	// Abort, Yield and GetTask.
	RoleWorker = "worker"
	// RoleReader may GetTask, ListTasks, CountTasks and Status.
	RoleReader = "reader"
)

// Roles lists the roles, for messages.
var Roles = []string{RoleAdmin, RoleProducer, RoleWorker, RoleReader}

// Grant gives a role on queues: names ("emails"), prefixes ending in *
// ("billing.*" is every queue whose name starts with "billing."), or "*"
// (every queue, and the calls that span queues: a list or count of all
// of them). No queues means "*".
type Grant struct {
	Role   string   `json:"role"`
	Queues []string `json:"queues,omitempty"`
}

// User is a name's grants. A name is a client certificate's user
// (norn://user/<name>) or a token's owner.
type User struct {
	Grants []Grant `json:"grants"`
}

// TokenEntry is a bearer token as the auth file keeps it: its public id
// (the token's first part) and the SHA-256 of the whole token, never the
// token itself.
type TokenEntry struct {
	ID      string    `json:"id"`
	User    string    `json:"user"`
	SHA256  string    `json:"sha256"`
	Created time.Time `json:"created"`
}

// File is the access file nornd -auth-file reads: users and their
// grants, and tokens. nornctl token create|revoke and nornctl grant edit
// it; nodes reload it when it changes.
type File struct {
	Users  map[string]User `json:"users"`
	Tokens []TokenEntry    `json:"tokens,omitempty"`
}

// tokenPrefix starts every token: norn_<id>_<secret>.
const tokenPrefix = "norn_"

// ReadFile reads and checks an access file. Unknown fields are
// refused (a typo must not drop a grant silently).
func ReadFile(path string) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth file: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var f File
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("auth file %s: %w", path, err)
	}
	if err := f.Validate(); err != nil {
		return nil, fmt.Errorf("auth file %s: %w", path, err)
	}
	if f.Users == nil {
		f.Users = map[string]User{}
	}
	return &f, nil
}

// Validate checks the roles, queue patterns and tokens.
func (f *File) Validate() error {
	for name, u := range f.Users {
		if name == "" {
			return errors.New("users: an empty user name")
		}
		for i, g := range u.Grants {
			if !slices.Contains(Roles, g.Role) {
				return fmt.Errorf("users.%s.grants[%d].role: %q is not a role (want one of %s)", name, i, g.Role, strings.Join(Roles, ", "))
			}
			for j, q := range g.Queues {
				if q == "" || strings.Contains(strings.TrimSuffix(q, "*"), "*") {
					return fmt.Errorf("users.%s.grants[%d].queues[%d]: %q: want a queue name, a prefix ending in *, or *", name, i, j, q)
				}
			}
		}
	}
	ids := map[string]bool{}
	for i, t := range f.Tokens {
		if t.ID == "" || t.User == "" || len(t.SHA256) != 64 {
			return fmt.Errorf("tokens[%d]: want id, user and a hex sha256", i)
		}
		if ids[t.ID] {
			return fmt.Errorf("tokens[%d]: id %s repeats", i, t.ID)
		}
		ids[t.ID] = true
	}
	return nil
}

// Write stores the file (mode 0600) through a temporary file renamed into
// place, so a node reloading never reads half of it.
func (f *File) Write(path string) error {
	if err := f.Validate(); err != nil {
		return err
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// NewToken makes a token for user: the token (shown once, never stored)
// and its entry for the file.
func NewToken(user string, now time.Time) (string, TokenEntry) {
	var id [4]byte
	var secret [24]byte
	rand.Read(id[:])     //nolint:errcheck // crypto/rand does not fail
	rand.Read(secret[:]) //nolint:errcheck
	tok := tokenPrefix + hex.EncodeToString(id[:]) + "_" + hex.EncodeToString(secret[:])
	sum := sha256.Sum256([]byte(tok))
	return tok, TokenEntry{ID: hex.EncodeToString(id[:]), User: user, SHA256: hex.EncodeToString(sum[:]), Created: now.UTC()}
}

// Rules are the access rules of a node: an File, read again by Reload
// (SIGHUP) or when its file changes (Watch). Safe for concurrent use.
type Rules struct {
	*transport.Reloader
	path string
	cur  atomic.Pointer[authState]
}

type authState struct {
	users  map[string]User
	tokens map[string]TokenEntry // by id
	digest string                // of the rules: Digest
}

// LoadRules reads the access file at path.
func LoadRules(path string) (*Rules, error) {
	a := &Rules{path: path}
	r, err := transport.NewReloader(a.load, path)
	if err != nil {
		return nil, err
	}
	a.Reloader = r
	return a, nil
}

// load reads the file and installs its rules; on an error the rules in
// use stay.
func (a *Rules) load() error {
	f, err := ReadFile(a.path)
	if err != nil {
		return err
	}
	canon, err := json.Marshal(f) // maps in key order: the same rules, the same bytes
	if err != nil {
		return err
	}
	sum := sha256.Sum256(canon)
	st := &authState{users: f.Users, tokens: map[string]TokenEntry{}, digest: hex.EncodeToString(sum[:6])}
	for _, t := range f.Tokens {
		st.tokens[t.ID] = t
	}
	a.cur.Store(st)
	return nil
}

// TokenUser returns the user of a valid token: one of the file's, its
// hash matching (compared in constant time).
func (a *Rules) TokenUser(tok string) (string, bool) {
	rest, ok := strings.CutPrefix(tok, tokenPrefix)
	if !ok {
		return "", false
	}
	id, _, ok := strings.Cut(rest, "_")
	if !ok {
		return "", false
	}
	e, ok := a.cur.Load().tokens[id]
	if !ok {
		return "", false
	}
	want, err := hex.DecodeString(e.SHA256)
	if err != nil {
		return "", false
	}
	sum := sha256.Sum256([]byte(tok))
	if subtle.ConstantTimeCompare(sum[:], want) != 1 {
		return "", false
	}
	return e.User, true
}

// Digest names the rules in use (12 hex digits of a SHA-256 of the
// file's users, grants and tokens): nodes with the same access file show
// the same digest in Status.
func (a *Rules) Digest() string { return a.cur.Load().digest }

// Grants returns a user's grants.
func (a *Rules) Grants(user string) []Grant { return a.cur.Load().users[user].Grants }

// queueMatch reports whether pattern covers queue.
func queueMatch(pattern, queue string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(queue, prefix)
	}
	return pattern == queue
}

// AllQueues reports whether g covers every queue.
func (g Grant) AllQueues() bool {
	return len(g.Queues) == 0 || slices.Contains(g.Queues, "*")
}

// Covers reports whether g covers queue.
func (g Grant) Covers(queue string) bool {
	if g.AllQueues() {
		return true
	}
	for _, p := range g.Queues {
		if queueMatch(p, queue) {
			return true
		}
	}
	return false
}
