package crdt

import (
	"errors"
	"fmt"
	"math"
	"unicode"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
)

// Limits bounds the sizes of user-supplied fields. The API layer validates
// every request with them before anything is stored.
type Limits struct {
	MaxPayloadBytes int // Spec.Payload, Terminal.Result and Update.Data; default 1 MiB
	MaxDependsOn    int // entries in Spec.DependsOn; default 1024
	MaxStringBytes  int // Update.Message, TaskError fields; default 64 KiB
	MaxErrors       int // entries in Terminal.Errors; default 64
	MaxArgs         int // entries in TaskError.Args; default 64
}

// DefaultLimits are the limits used when a configuration sets none.
var DefaultLimits = Limits{
	MaxPayloadBytes: 1 << 20,
	MaxDependsOn:    1024,
	MaxStringBytes:  64 << 10,
	MaxErrors:       64,
	MaxArgs:         64,
}

// MaxQueueLen is the longest queue name in bytes.
const MaxQueueLen = 128

// ErrInvalid is wrapped by every validation error; the concrete error is a
// *FieldError naming the offending field.
var ErrInvalid = errors.New("invalid argument")

// ErrTooLarge is wrapped by validation errors about sizes (the API
// answers them INVALID_ARGUMENT as any bad field: a retry fails again).
var ErrTooLarge = errors.New("too large")

// FieldError is a validation failure of one named field.
type FieldError struct {
	Field  string // dotted path, e.g. "spec.queue"
	Reason string
	kind   error // ErrInvalid or ErrTooLarge
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

// Unwrap returns ErrInvalid or ErrTooLarge.
func (e *FieldError) Unwrap() error { return e.kind }

func invalid(field, format string, args ...any) error {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...), kind: ErrInvalid}
}

func tooLarge(field string, n, max int) error {
	return &FieldError{Field: field, Reason: fmt.Sprintf("%d exceeds the limit of %d", n, max), kind: ErrTooLarge}
}

// ValidateQueue checks a queue name: 1-128 bytes of [A-Za-z0-9._:-].
func ValidateQueue(field, q string) error {
	if len(q) == 0 || len(q) > MaxQueueLen {
		return invalid(field, "must be 1-%d bytes, got %d", MaxQueueLen, len(q))
	}
	for i := 0; i < len(q); i++ {
		c := q[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '_' || c == ':' || c == '-'
		if !ok {
			return invalid(field, "byte %q at offset %d is not in [A-Za-z0-9._:-]", c, i)
		}
	}
	return nil
}

// Validate checks a spec against lim. Field names are prefixed "spec.".
func (s *Spec) Validate(lim Limits) error {
	if err := ValidateQueue("spec.queue", s.Queue); err != nil {
		return err
	}
	if len(s.Payload) > lim.MaxPayloadBytes {
		return tooLarge("spec.payload", len(s.Payload), lim.MaxPayloadBytes)
	}
	if s.NotBeforeMs < 0 {
		return invalid("spec.notBefore", "must not be before 1970")
	}
	if s.DeadlineMs < 0 {
		return invalid("spec.deadline", "must not be before 1970")
	}
	if s.DeadlineMs != 0 && s.DeadlineMs <= s.NotBeforeMs {
		return invalid("spec.deadline", "must be after spec.notBefore: the task could never run")
	}
	if err := s.validateUnique(); err != nil {
		return err
	}
	if err := s.validateFairness(); err != nil {
		return err
	}
	if len(s.DependsOn) > lim.MaxDependsOn {
		return tooLarge("spec.dependsOn", len(s.DependsOn), lim.MaxDependsOn)
	}
	seen := make(map[uint64]struct{}, len(s.DependsOn))
	for i, d := range s.DependsOn {
		if d == 0 {
			return invalid(fmt.Sprintf("spec.dependsOn[%d]", i), "id 0 is not a task id")
		}
		if _, dup := seen[d]; dup {
			return invalid(fmt.Sprintf("spec.dependsOn[%d]", i), "duplicate id %d", d)
		}
		seen[d] = struct{}{}
	}
	if p := s.Retry; p != nil {
		if err := p.Validate(); err != nil {
			return invalid("spec.retry", "%v", err)
		}
		if s.MaxClaims != 0 && s.MaxClaims != p.MaxAttempts {
			return invalid("spec.maxClaims", "must be 0 or equal to spec.retry.maxAttempts (%d) when a retry policy is set, got %d", p.MaxAttempts, s.MaxClaims)
		}
	}
	return nil
}

// Validate checks an update against lim.
func (u *Update) Validate(lim Limits) error {
	if u.Claim == 0 {
		return invalid("claimId", "required")
	}
	if math.IsNaN(u.Progress) || u.Progress < 0 || u.Progress > 1 {
		return invalid("progress", "must be in [0, 1], got %v", u.Progress)
	}
	if len(u.Message) > lim.MaxStringBytes {
		return tooLarge("message", len(u.Message), lim.MaxStringBytes)
	}
	if len(u.Data) > lim.MaxPayloadBytes {
		return tooLarge("data", len(u.Data), lim.MaxPayloadBytes)
	}
	return nil
}

// Validate checks a terminal event a client asks for against lim: a
// completion or abort names the claim it ends.
func (t *Terminal) Validate(lim Limits) error {
	if t.Kind != Cancelled && t.Claim == 0 && t.Kind.valid() {
		return invalid("claimId", "required")
	}
	return t.validate(lim)
}

// validate checks a terminal event as any node may have made it: the
// node's own aborts (max_claims reached, a dependency failed) end no
// claim and carry claim 0.
func (t *Terminal) validate(lim Limits) error {
	if !t.Kind.valid() {
		return invalid("kind", "unknown terminal kind %d", t.Kind)
	}
	if t.Kind == Completed && t.Claim == 0 {
		return invalid("claimId", "required")
	}
	if len(t.Result) > lim.MaxPayloadBytes {
		return tooLarge("result", len(t.Result), lim.MaxPayloadBytes)
	}
	return validateErrors("errors", t.Errors, lim)
}

// validateErrors checks a list of task errors (field: its name).
func validateErrors(field string, errs []TaskError, lim Limits) error {
	if len(errs) > lim.MaxErrors {
		return tooLarge(field, len(errs), lim.MaxErrors)
	}
	for i, e := range errs {
		f := fmt.Sprintf("%s[%d]", field, i)
		if e.Code == "" {
			return invalid(f+".code", "required")
		}
		if len(e.Code) > lim.MaxStringBytes {
			return tooLarge(f+".code", len(e.Code), lim.MaxStringBytes)
		}
		if len(e.Description) > lim.MaxStringBytes {
			return tooLarge(f+".description", len(e.Description), lim.MaxStringBytes)
		}
		if len(e.Args) > lim.MaxArgs {
			return tooLarge(f+".args", len(e.Args), lim.MaxArgs)
		}
		for j, a := range e.Args {
			if len(a) > lim.MaxStringBytes {
				return tooLarge(fmt.Sprintf("%s.args[%d]", f, j), len(a), lim.MaxStringBytes)
			}
		}
	}
	return nil
}

// Validate checks every part of a task state received from a peer (its
// spec, updates and terminal events) field by field, as the API edge
// checks a client's; but an abort without a claim is a node's own (see
// Terminal.validate), which a client cannot ask for.
func (t *Task) Validate(lim Limits) error {
	if t.Spec != nil {
		if err := t.Spec.Validate(lim); err != nil {
			return err
		}
	}
	for i := range t.Updates {
		if err := t.Updates[i].Validate(lim); err != nil {
			return err
		}
	}
	for i := range t.Terminals {
		if err := t.Terminals[i].validate(lim); err != nil {
			return err
		}
	}
	for i, r := range t.Revivals {
		if r.Life == 0 {
			return invalid(fmt.Sprintf("revivals[%d].life", i), "must be at least 1")
		}
	}
	for i := range t.Failures {
		f := &t.Failures[i]
		if f.Claim == 0 {
			return invalid(fmt.Sprintf("failures[%d].claimId", i), "required")
		}
		if err := validateErrors(fmt.Sprintf("failures[%d].errors", i), f.Errors, lim); err != nil {
			return err
		}
	}
	return nil
}

// Unique keys' bounds (TaskSpec.unique_key, unique_for).
const (
	MaxUniqueKeyLen = 256
	MaxUniqueForMs  = 366 * 24 * 3600 * 1000
)

// validateUnique checks the unique key and its window.
func (s *Spec) validateUnique() error {
	if s.UniqueKey == "" {
		if s.UniqueForMs != 0 {
			return invalid("spec.uniqueFor", "needs spec.uniqueKey")
		}
		return nil
	}
	if len(s.UniqueKey) > MaxUniqueKeyLen {
		return invalid("spec.uniqueKey", "must be 1-%d bytes, got %d", MaxUniqueKeyLen, len(s.UniqueKey))
	}
	if err := validateKeyText("spec.uniqueKey", s.UniqueKey); err != nil {
		return err
	}
	if s.UniqueForMs < 0 || s.UniqueForMs > MaxUniqueForMs {
		return invalid("spec.uniqueFor", "must be 1s to 8784h (366 days), got %dms", s.UniqueForMs)
	}
	return nil
}

// Fairness keys' bounds (TaskSpec.fairness_key, fairness_weight).
const (
	MaxFairnessKeyLen = 128
	MaxFairnessWeight = 1000
)

// validateFairness checks the fairness key and its weight.
func (s *Spec) validateFairness() error {
	if s.FairnessWeight > MaxFairnessWeight {
		return invalid("spec.fairnessWeight", "must be 1-%d (0 means 1), got %d", MaxFairnessWeight, s.FairnessWeight)
	}
	if s.FairnessKey == "" {
		if s.FairnessWeight > 1 {
			return invalid("spec.fairnessWeight", "needs spec.fairnessKey (tasks without a key are one key of weight 1)")
		}
		return nil
	}
	if len(s.FairnessKey) > MaxFairnessKeyLen {
		return invalid("spec.fairnessKey", "must be at most %d bytes, got %d", MaxFairnessKeyLen, len(s.FairnessKey))
	}
	return validateKeyText("spec.fairnessKey", s.FairnessKey)
}

// validateKeyText checks that a key (field) is UTF-8 without control
// characters.
func validateKeyText(field, key string) error {
	if !utf8.ValidString(key) {
		return invalid(field, "must be UTF-8")
	}
	for i, r := range key {
		if unicode.IsControl(r) {
			return invalid(field, "control character %U at offset %d", r, i)
		}
	}
	return nil
}

// SpecDigest is the digest of what a client gave of s (every field but
// CreatedAt): two enqueues of one spec have the same digest.
func SpecDigest(s *Spec) uint64 {
	c := *s
	c.CreatedAt = Timestamp{}
	return xxhash.Sum64(appendSpec(nil, &c))
}
