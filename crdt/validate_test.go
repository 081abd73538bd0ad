package crdt

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	lim := Limits{MaxPayloadBytes: 8, MaxDependsOn: 2, MaxStringBytes: 4, MaxErrors: 1, MaxArgs: 1}
	tests := []struct {
		name  string
		err   error
		field string // "" = valid
		kind  error
	}{
		{"good spec", (&Spec{Queue: "a.b_c:d-1", DependsOn: []uint64{1, 2}}).Validate(lim), "", nil},
		{"empty queue", (&Spec{}).Validate(lim), "spec.queue", ErrInvalid},
		{"long queue", (&Spec{Queue: strings.Repeat("q", 129)}).Validate(lim), "spec.queue", ErrInvalid},
		{"queue charset", (&Spec{Queue: "a b"}).Validate(lim), "spec.queue", ErrInvalid},
		{"queue nul", (&Spec{Queue: "a\x00"}).Validate(lim), "spec.queue", ErrInvalid},
		{"payload", (&Spec{Queue: "q", Payload: make([]byte, 9)}).Validate(lim), "spec.payload", ErrTooLarge},
		{"not before", (&Spec{Queue: "q", NotBeforeMs: -1}).Validate(lim), "spec.notBefore", ErrInvalid},
		{"deps count", (&Spec{Queue: "q", DependsOn: []uint64{1, 2, 3}}).Validate(lim), "spec.dependsOn", ErrTooLarge},
		{"dep zero", (&Spec{Queue: "q", DependsOn: []uint64{0}}).Validate(lim), "spec.dependsOn[0]", ErrInvalid},
		{"dep dup", (&Spec{Queue: "q", DependsOn: []uint64{4, 4}}).Validate(lim), "spec.dependsOn[1]", ErrInvalid},
		{"good update", (&Update{Claim: 1, Progress: 1}).Validate(lim), "", nil},
		{"update claim", (&Update{Progress: 0.5}).Validate(lim), "claimId", ErrInvalid},
		{"update NaN", (&Update{Claim: 1, Progress: math.NaN()}).Validate(lim), "progress", ErrInvalid},
		{"update >1", (&Update{Claim: 1, Progress: 1.5}).Validate(lim), "progress", ErrInvalid},
		{"update message", (&Update{Claim: 1, Message: "hello"}).Validate(lim), "message", ErrTooLarge},
		{"update data", (&Update{Claim: 1, Data: make([]byte, 9)}).Validate(lim), "data", ErrTooLarge},
		{"good cancel", (&Terminal{Kind: Cancelled}).Validate(lim), "", nil},
		{"bad kind", (&Terminal{Kind: 0}).Validate(lim), "kind", ErrInvalid},
		{"complete claim", (&Terminal{Kind: Completed}).Validate(lim), "claimId", ErrInvalid},
		{"result", (&Terminal{Kind: Completed, Claim: 1, Result: make([]byte, 9)}).Validate(lim), "result", ErrTooLarge},
		{"errors count", (&Terminal{Kind: Aborted, Claim: 1, Errors: make([]TaskError, 2)}).Validate(lim), "errors", ErrTooLarge},
		{"error code", (&Terminal{Kind: Aborted, Claim: 1, Errors: []TaskError{{}}}).Validate(lim), "errors[0].code", ErrInvalid},
		{"abort claim", (&Terminal{Kind: Aborted, Errors: []TaskError{{Code: "c"}}}).Validate(lim), "claimId", ErrInvalid},
		// A node's own abort (max_claims reached, a dependency failed)
		// carries no claim; peers must take it.
		{"peer's node abort", (&Task{ID: 1, Terminals: []Terminal{{Kind: Aborted, Errors: []TaskError{{Code: "c"}}}}}).Validate(lim), "", nil},
		{"peer's complete claim", (&Task{ID: 1, Terminals: []Terminal{{Kind: Completed}}}).Validate(lim), "claimId", ErrInvalid},
		{"error arg", (&Terminal{Kind: Aborted, Claim: 1, Errors: []TaskError{{Code: "c", Args: []string{"12345"}}}}).Validate(lim), "errors[0].args[0]", ErrTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.field == "" {
				if tt.err != nil {
					t.Fatalf("unexpected error %v", tt.err)
				}
				return
			}
			var fe *FieldError
			if !errors.As(tt.err, &fe) || fe.Field != tt.field || !errors.Is(tt.err, tt.kind) {
				t.Fatalf("err = %v, want a %v error on field %q", tt.err, tt.kind, tt.field)
			}
		})
	}
}
