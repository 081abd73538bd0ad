package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/norn-dev/norn/access"
	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

const tokenHelp = `Edits the bearer tokens of an access file (nornd -auth-file; nodes reload
it when it changes). A token speaks for a user, whose grants (nornctl
grant) say what it may do. The file keeps only each token's SHA-256.

  nornctl token create <user> [--auth-file auth.json]
      prints a new token once: keep it (NORN_TOKEN, client.WithToken).
  nornctl token revoke <id> [--auth-file auth.json]
      the token stops working once the nodes reload the file.
  nornctl token list [--auth-file auth.json]

The file is created when missing.`

const grantHelp = `Gives a user a role on queues in an access file (nornd -auth-file), or
takes it back with --remove. Roles: admin (everything), producer (enqueue,
get, list, count, cancel), worker (claim, renew, update, complete, abort,
yield, get), reader (get, list, count, status). Queues: names, prefixes
ending in * (billing.*), or * (every queue, the default). A user is a
client certificate's name (nornctl cert create-client) or a token's owner.

  nornctl grant alice worker --queues emails,billing.*
  nornctl grant --remove alice worker`

// authFileFlag is the default access file of token and grant.
const authFileFlag = "auth.json"

// readOrNewAuthFile reads path, or starts an empty file when it is missing.
func readOrNewAuthFile(path string) (*access.File, error) {
	f, err := access.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return &access.File{Users: map[string]access.User{}}, nil
	}
	return f, err
}

func runToken(e *env, cmd *command, args []string) error {
	fs := e.flagSet(cmd)
	path := fs.String("auth-file", authFileFlag, "the access file")
	pos, err := e.parse(cmd, fs, args, 1, 2)
	if err != nil {
		return err
	}
	f, err := readOrNewAuthFile(*path)
	if err != nil {
		return err
	}
	switch {
	case pos[0] == "create" && len(pos) == 2:
		tok, entry := access.NewToken(pos[1], time.Now())
		f.Tokens = append(f.Tokens, entry)
		if err := f.Write(*path); err != nil {
			return err
		}
		if _, ok := f.Users[pos[1]]; !ok {
			fmt.Fprintf(e.stderr, "nornctl: user %q has no grant yet: nornctl grant %s <role>\n", pos[1], pos[1])
		}
		fmt.Fprintln(e.stdout, tok)
	case pos[0] == "revoke" && len(pos) == 2:
		i := slices.IndexFunc(f.Tokens, func(t access.TokenEntry) bool { return t.ID == pos[1] })
		if i < 0 {
			return fmt.Errorf("no token %q in %s", pos[1], *path)
		}
		f.Tokens = slices.Delete(f.Tokens, i, i+1)
		return f.Write(*path)
	case pos[0] == "list" && len(pos) == 1:
		for _, t := range f.Tokens {
			fmt.Fprintf(e.stdout, "%s\t%s\t%s\n", t.ID, t.User, t.Created.Format(time.RFC3339))
		}
	default:
		return usagef(cmd, "want create <user>, revoke <id> or list")
	}
	return nil
}

func runGrant(e *env, cmd *command, args []string) error {
	fs := e.flagSet(cmd)
	path := fs.String("auth-file", authFileFlag, "the access file")
	queues := fs.String("queues", "*", "comma-separated queue names, prefixes ending in *, or *")
	remove := fs.Bool("remove", false, "take the user's grants of the role away")
	pos, err := e.parse(cmd, fs, args, 2, 2)
	if err != nil {
		return err
	}
	user, role := pos[0], pos[1]
	if !slices.Contains(access.Roles, role) {
		return usagef(cmd, "role %q: want one of %s", role, strings.Join(access.Roles, ", "))
	}
	f, err := readOrNewAuthFile(*path)
	if err != nil {
		return err
	}
	u := f.Users[user]
	if *remove {
		u.Grants = slices.DeleteFunc(u.Grants, func(g access.Grant) bool { return g.Role == role })
	} else {
		g := access.Grant{Role: role, Queues: splitList(*queues)}
		if slices.Equal(g.Queues, []string{"*"}) {
			g.Queues = nil
		}
		u.Grants = append(u.Grants, g)
	}
	if len(u.Grants) == 0 {
		delete(f.Users, user)
	} else {
		f.Users[user] = u
	}
	return f.Write(*path)
}

// runWhoAmI asks the node who it takes the caller for (AdminService.WhoAmI):
// its user and grants, to check a token or certificate.
func runWhoAmI(e *env, cmd *command, args []string) error {
	fs := e.flagSet(cmd)
	if _, err := e.parse(cmd, fs, args, 0, 0); err != nil {
		return err
	}
	admin, err := e.admin()
	if err != nil {
		return err
	}
	ctx, cancel := e.callContext()
	defer cancel()
	r, err := admin.WhoAmI(ctx, connect.NewRequest(&nornv1.WhoAmIRequest{}))
	if err != nil {
		return err
	}
	me := r.Msg
	return e.emit(me, func(w io.Writer) {
		switch {
		case me.Node != "":
			fmt.Fprintf(w, "node %s (certificate): may call everything\n", me.Node)
		case !me.AccessControl && me.User != "":
			fmt.Fprintf(w, "user %s (%s): this node has no access file: may call everything\n", me.User, me.Via)
		case !me.AccessControl:
			fmt.Fprintln(w, "this node checks no caller: anyone may call everything")
		default:
			fmt.Fprintf(w, "user %s (%s)\n", me.User, me.Via)
			if len(me.Grants) == 0 {
				fmt.Fprintln(w, "no grants: may call nothing but whoami")
			}
			for _, g := range me.Grants {
				qs := "*"
				if len(g.Queues) > 0 {
					qs = strings.Join(g.Queues, ",")
				}
				fmt.Fprintf(w, "%-8s on %s\n", g.Role, qs)
			}
		}
	})
}
