package main

import (
	"flag"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
)

// completion is the last command; it adds itself here because its run
// reads the table (a reference from the table's initializer would be an
// initialization cycle).
func init() {
	commands = append(commands, &command{name: "completion", args: "bash|zsh|fish",
		summary: "print a shell completion script", help: completionHelp, run: runCompletion})
}

const completionHelp = `
Prints a script that completes nornctl's commands, their flags and
subcommands, and the global flags, in bash, zsh or fish; file names
elsewhere.

  source <(nornctl completion bash)                 # bash, now; or in ~/.bashrc
  nornctl completion zsh > "${fpath[1]}/_nornctl"   # zsh (compinit loads it)
  nornctl completion fish > ~/.config/fish/completions/nornctl.fish`

func runCompletion(e *env, cmd *command, args []string) error {
	fs := e.flagSet(cmd)
	pos, err := e.parse(cmd, fs, args, 1, 1)
	if err != nil {
		return err
	}
	spec := completionSpec()
	switch pos[0] {
	case "bash":
		writeBashCompletion(e.stdout, spec)
	case "zsh":
		writeZshCompletion(e.stdout, spec)
	case "fish":
		writeFishCompletion(e.stdout, spec)
	default:
		return usagef(cmd, "shell %q: want bash, zsh or fish", pos[0])
	}
	return nil
}

// completionFlag is one flag of a completion script.
type completionFlag struct {
	name, usage string
	takesValue  bool
}

// completionCommand is one command of a completion script.
type completionCommand struct {
	name, summary string
	words         []string // its subcommands (rebalance status, cert create-ca, ...)
	flags         []completionFlag
}

// completionTable is what a completion script completes.
type completionTable struct {
	globals  []completionFlag
	commands []completionCommand // the table's, then help
}

// completionSpec reads the commands table: each command's flags are those
// its run defines, found by running it with -h (which parses nothing else
// and prints its usage, here discarded).
func completionSpec() completionTable {
	var g globals
	gfs := flag.NewFlagSet("nornctl", flag.ContinueOnError)
	g.register(gfs)
	spec := completionTable{globals: flagsOf(gfs, nil)}
	globalNames := map[string]bool{}
	for _, f := range spec.globals {
		globalNames[f.name] = true
	}
	for _, c := range commands {
		cc := completionCommand{name: c.name, summary: c.summary, words: subcommandWords(c.args)}
		e := &env{stdout: io.Discard, stderr: io.Discard, stdin: strings.NewReader("")}
		var fs *flag.FlagSet
		e.onFlagSet = func(f *flag.FlagSet) { fs = f }
		c.run(e, c, []string{"-h"}) //nolint:errcheck // flag.ErrHelp
		if fs != nil {
			cc.flags = flagsOf(fs, globalNames)
		}
		spec.commands = append(spec.commands, cc)
	}
	help := completionCommand{name: "help", summary: "show a command's usage"}
	for _, c := range commands {
		help.words = append(help.words, c.name)
	}
	spec.commands = append(spec.commands, help)
	return spec
}

// flagsOf lists fs's flags in name order, leaving out those in skip.
func flagsOf(fs *flag.FlagSet, skip map[string]bool) []completionFlag {
	var out []completionFlag
	fs.VisitAll(func(f *flag.Flag) {
		if skip[f.Name] {
			return
		}
		b, isBool := f.Value.(interface{ IsBoolFlag() bool })
		out = append(out, completionFlag{name: f.Name, usage: f.Usage, takesValue: !isBool || !b.IsBoolFlag()})
	})
	return out
}

// subcommandWord matches a literal word of a usage's arguments.
var subcommandWord = regexp.MustCompile(`^[a-z][a-z-]*$`)

// subcommandWords are the literal words of a command's usage arguments:
// "[status|cancel]" has status and cancel, "<queue> [payload]" none.
func subcommandWords(args string) []string {
	var out []string
	for w := range strings.FieldsFuncSeq(args, func(r rune) bool { return strings.ContainsRune(" |[]", r) }) {
		if subcommandWord.MatchString(w) && !slices.Contains(out, w) && w != "payload" {
			out = append(out, w)
		}
	}
	return out
}

// flagWords is "--a --b" for a compgen word list.
func flagWords(fs []completionFlag) string {
	var out []string
	for _, f := range fs {
		out = append(out, "--"+f.name)
	}
	return strings.Join(out, " ")
}

// valueFlags is the case pattern of the flags that take a value
// ("--addr|-addr|--o|-o"), "" when none do.
func valueFlags(fs []completionFlag) string {
	var out []string
	for _, f := range fs {
		if f.takesValue {
			out = append(out, "--"+f.name, "-"+f.name)
		}
	}
	return strings.Join(out, "|")
}

func writeBashCompletion(w io.Writer, spec completionTable) {
	var names []string
	for _, c := range spec.commands {
		names = append(names, c.name)
	}
	fmt.Fprintf(w, `# bash completion of nornctl (nornctl completion bash); load it with:
#   source <(nornctl completion bash)
_nornctl() {
	local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} cmd="" i
	local globals=%q
	for ((i = 1; i < COMP_CWORD; i++)); do
		case ${COMP_WORDS[i]} in
		%s) ((i++)) ;;
		-*) ;;
		*) cmd=${COMP_WORDS[i]}; break ;;
		esac
	done
	case $prev in
	%s) COMPREPLY=($(compgen -f -- "$cur")); return ;;
	esac
	local words=""
	case $cmd in
	"") words="%s $globals" ;;
`, flagWords(spec.globals), valueFlags(spec.globals), allValueFlags(spec), strings.Join(names, " "))
	for _, c := range spec.commands {
		fmt.Fprintf(w, "\t%s) words=%q ;;\n", c.name, strings.TrimSpace(strings.Join(c.words, " ")+" "+flagWords(c.flags)))
	}
	fmt.Fprintf(w, `	esac
	if [[ -n $cmd ]]; then
		words="$words $globals"
	fi
	COMPREPLY=($(compgen -W "$words" -- "$cur"))
	if [[ ${#COMPREPLY[@]} -eq 0 && $cur != -* ]]; then
		COMPREPLY=($(compgen -f -- "$cur"))
	fi
}
complete -F _nornctl nornctl
`)
}

// allValueFlags is valueFlags over the global flags and every command's.
func allValueFlags(spec completionTable) string {
	seen := map[string]bool{}
	var all []completionFlag
	for _, f := range spec.globals {
		seen[f.name] = true
		all = append(all, f)
	}
	for _, c := range spec.commands {
		for _, f := range c.flags {
			if !seen[f.name] {
				seen[f.name] = true
				all = append(all, f)
			}
		}
	}
	return valueFlags(all)
}

// zshQuote quotes s for a zsh single-quoted word.
func zshQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// zshDescribe is "name:description" for _describe, ':' in name escaped.
func zshDescribe(name, desc string) string {
	return zshQuote(strings.ReplaceAll(name, ":", `\:`) + ":" + oneLineUsage(desc))
}

// oneLineUsage is the first line of a flag's usage.
func oneLineUsage(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

func writeZshCompletion(w io.Writer, spec completionTable) {
	fmt.Fprintf(w, "#compdef nornctl\n# zsh completion of nornctl (nornctl completion zsh): put it in a directory\n# of $fpath as _nornctl.\n")
	fmt.Fprintf(w, "_nornctl() {\n\tlocal cmd i\n\tlocal -a globals cmds opts\n\tglobals=(")
	for _, f := range spec.globals {
		fmt.Fprintf(w, " %s", zshDescribe("--"+f.name, f.usage))
	}
	fmt.Fprintf(w, ")\n\tfor ((i = 2; i < CURRENT; i++)); do\n\t\tcase ${words[i]} in\n\t\t%s) ((i++)) ;;\n\t\t-*) ;;\n\t\t*) cmd=${words[i]}; break ;;\n\t\tesac\n\tdone\n",
		valueFlags(spec.globals))
	fmt.Fprintf(w, "\tcase ${words[CURRENT-1]} in\n\t%s) _files; return ;;\n\tesac\n", allValueFlags(spec))
	fmt.Fprintf(w, "\tif [[ -z $cmd ]]; then\n\t\tcmds=(")
	for _, c := range spec.commands {
		fmt.Fprintf(w, " %s", zshDescribe(c.name, c.summary))
	}
	fmt.Fprintf(w, ")\n\t\t_describe command cmds\n\t\t_describe 'global flag' globals\n\t\treturn\n\tfi\n\tcase $cmd in\n")
	for _, c := range spec.commands {
		fmt.Fprintf(w, "\t%s) opts=(", c.name)
		for _, s := range c.words {
			fmt.Fprintf(w, " %s", zshDescribe(s, c.name+" "+s))
		}
		for _, f := range c.flags {
			fmt.Fprintf(w, " %s", zshDescribe("--"+f.name, f.usage))
		}
		fmt.Fprintf(w, ") ;;\n")
	}
	fmt.Fprintf(w, "\tesac\n\t_describe %s opts\n\t_describe 'global flag' globals\n\t_files\n}\n\n# Autoloaded from $fpath: complete now; sourced: register.\nif [[ $funcstack[1] == _nornctl ]]; then\n\t_nornctl \"$@\"\nelse\n\tcompdef _nornctl nornctl\nfi\n", zshQuote("nornctl $cmd"))
}

// fishQuote quotes s for fish (single quotes; \\ and \' escaped).
func fishQuote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// fishFlag is a complete line's option of flag name: -s for one letter,
// -l otherwise (Go's flag package takes -name and --name alike).
func fishFlag(f completionFlag) string {
	opt := "-l " + f.name
	if len(f.name) == 1 {
		opt = "-s " + f.name
	}
	if f.takesValue {
		opt += " -r"
	}
	return opt + " -d " + fishQuote(oneLineUsage(f.usage))
}

func writeFishCompletion(w io.Writer, spec completionTable) {
	fmt.Fprintf(w, "# fish completion of nornctl (nornctl completion fish): save it as\n# ~/.config/fish/completions/nornctl.fish.\n")
	var names []string
	for _, c := range spec.commands {
		names = append(names, c.name)
	}
	// Double quotes: the condition takes the list when the file is read.
	fmt.Fprintf(w, "set -l nornctl_commands %s\n", strings.Join(names, " "))
	for _, f := range spec.globals {
		fmt.Fprintf(w, "complete -c nornctl %s\n", fishFlag(f))
	}
	for _, c := range spec.commands {
		fmt.Fprintf(w, "complete -c nornctl -f -n \"not __fish_seen_subcommand_from $nornctl_commands\" -a %s -d %s\n", c.name, fishQuote(c.summary))
		cond := fmt.Sprintf("-n '__fish_seen_subcommand_from %s'", c.name)
		for _, s := range c.words {
			fmt.Fprintf(w, "complete -c nornctl -f %s -a %s\n", cond, fishQuote(s))
		}
		for _, f := range c.flags {
			fmt.Fprintf(w, "complete -c nornctl %s %s\n", cond, fishFlag(f))
		}
	}
}
