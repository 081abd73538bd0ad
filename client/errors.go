package client

import (
	"errors"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	nornv1 "github.com/norn-dev/norn/api/norn/v1"
)

// Errors of the server keep their connect code: connect.CodeOf(err) works
// on every error a Client method returns, and errors.As finds the
// *connect.Error with its message and details. In addition, errors.Is
// matches them against these sentinels, one per code a caller acts on.
var (
	// ErrNotFound: no such task (NOT_FOUND).
	ErrNotFound = errors.New("norn: not found")

	// ErrSuperseded: the claim was superseded or has ended (expired,
	// yielded), or the task is terminal, for example cancelled
	// (FAILED_PRECONDITION). A worker holding the task must stop working
	// on it.
	ErrSuperseded = errors.New("norn: claim superseded or ended, or task terminal")

	// ErrUnavailable: the write quorum was not reached, a partition had no
	// leader, or the node could not be reached (UNAVAILABLE), after the
	// client's retries. For a write, it may still have taken effect.
	ErrUnavailable = errors.New("norn: unavailable")

	// ErrInvalidArgument: a malformed or out-of-range request field, named
	// in the message (INVALID_ARGUMENT).
	ErrInvalidArgument = errors.New("norn: invalid argument")

	// ErrAlreadyExists: an enqueue reused the id of a task with another
	// spec (ALREADY_EXISTS).
	ErrAlreadyExists = errors.New("norn: already exists")

	// ErrResourceExhausted: a whole request over the node's request size
	// limit, or a node out of room for requests in flight
	// (RESOURCE_EXHAUSTED). A field over its own limit (a payload) is
	// ErrInvalidArgument.
	ErrResourceExhausted = errors.New("norn: resource exhausted")

	// ErrClosed: the Client was closed before the call.
	ErrClosed = errors.New("norn: client closed")
)

// sentinelCodes maps each sentinel to its connect code.
var sentinelCodes = map[error]connect.Code{
	ErrNotFound:          connect.CodeNotFound,
	ErrSuperseded:        connect.CodeFailedPrecondition,
	ErrUnavailable:       connect.CodeUnavailable,
	ErrInvalidArgument:   connect.CodeInvalidArgument,
	ErrAlreadyExists:     connect.CodeAlreadyExists,
	ErrResourceExhausted: connect.CodeResourceExhausted,
}

// IsSuperseded reports whether err has the code FAILED_PRECONDITION: the
// claim was superseded or has ended, or the task is terminal. Unlike
// errors.Is(err, ErrSuperseded) it also works on errors of the raw
// TaskService client.
func IsSuperseded(err error) bool { return connect.CodeOf(err) == connect.CodeFailedPrecondition }

// IsNotFound reports whether err has the code NOT_FOUND.
func IsNotFound(err error) bool { return connect.CodeOf(err) == connect.CodeNotFound }

// IsUnavailable reports whether err has the code UNAVAILABLE.
func IsUnavailable(err error) bool { return connect.CodeOf(err) == connect.CodeUnavailable }

// WriteFailureOf returns the WriteFailure detail of an UNAVAILABLE write
// error: the ids the write used (retry with them) and the acks it got.
func WriteFailureOf(err error) (*nornv1.WriteFailure, bool) {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return nil, false
	}
	name := string((*nornv1.WriteFailure)(nil).ProtoReflect().Descriptor().FullName())
	for _, d := range ce.Details() {
		if d.Type() != name {
			continue
		}
		if v, err := d.Value(); err == nil {
			if wf, ok := v.(*nornv1.WriteFailure); ok {
				return wf, true
			}
		}
		wf := new(nornv1.WriteFailure)
		if proto.Unmarshal(d.Bytes(), wf) == nil {
			return wf, true
		}
	}
	return nil, false
}

// callError is what Client methods return: the method name for the
// message, the underlying (usually *connect.Error) error for errors.As and
// connect.CodeOf, the sentinels for errors.Is, and the context's error
// when the call gave up waiting to retry.
type callError struct {
	method string
	err    error
	ctxErr error
}

func (e *callError) Error() string {
	s := "norn: " + e.method + ": " + e.err.Error()
	if e.ctxErr != nil {
		s += " (gave up retrying: " + e.ctxErr.Error() + ")"
	}
	return s
}

func (e *callError) Unwrap() []error {
	if e.ctxErr != nil {
		return []error{e.err, e.ctxErr}
	}
	return []error{e.err}
}

func (e *callError) Is(target error) bool {
	code, ok := sentinelCodes[target]
	return ok && connect.CodeOf(e.err) == code
}

// wrapErr wraps err (non-nil) for method.
func wrapErr(method string, err error) error {
	return &callError{method: method, err: err}
}

// invalidArg is a client-side INVALID_ARGUMENT error.
func invalidArg(method, msg string) error {
	return wrapErr(method, connect.NewError(connect.CodeInvalidArgument, errors.New(msg)))
}
