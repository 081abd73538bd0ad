package apierr

import (
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/norn-dev/norn/claims"
	"github.com/norn-dev/norn/crdt"
	"github.com/norn-dev/norn/storage"
)

// NotFormed answers requests before the node has a ring.
var NotFormed = connect.NewError(connect.CodeUnavailable,
	errors.New("the cluster is not formed yet (waiting for the expected nodes)"))

// Invalid returns an INVALID_ARGUMENT error naming field: in its
// message ("field: reason") and in a google.rpc.BadRequest detail.
func Invalid(field, format string, args ...any) error {
	reason := fmt.Sprintf(format, args...)
	return WithField(connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s: %s", field, reason)), field, reason)
}

// WithField adds to ce a google.rpc.BadRequest detail naming field (its
// JSON path in the request) and why it was refused, so that a client
// finds the field without reading the message. It returns ce.
func WithField(ce *connect.Error, field, reason string) *connect.Error {
	d, err := connect.NewErrorDetail(&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: reason}}})
	if err == nil {
		ce.AddDetail(d)
	}
	return ce
}

// Duration formats d as the API takes a duration in JSON (protojson's
// google.protobuf.Duration: seconds with 0, 3, 6 or 9 decimals and an
// "s", as "3600s" or "0.250s"), so that what an error names can be sent
// back as it is.
func Duration(d time.Duration) string {
	sign := ""
	if d < 0 {
		sign, d = "-", -d
	}
	secs, nanos := int64(d/time.Second), int64(d%time.Second)
	switch {
	case nanos == 0:
		return fmt.Sprintf("%s%ds", sign, secs)
	case nanos%1e6 == 0:
		return fmt.Sprintf("%s%d.%03ds", sign, secs, nanos/1e6)
	case nanos%1e3 == 0:
		return fmt.Sprintf("%s%d.%06ds", sign, secs, nanos/1e3)
	}
	return fmt.Sprintf("%s%d.%09ds", sign, secs, nanos)
}

// From maps an internal error to its connect code (DESIGN section 6).
// Errors that already carry a code pass through; nil stays nil.
func From(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	var fe *crdt.FieldError
	switch {
	case errors.As(err, &ce):
		return err
	case errors.As(err, &fe):
		// A field over its size limit too: the same request would fail
		// again (RESOURCE_EXHAUSTED, HTTP 429, would invite a retry).
		return WithField(connect.NewError(connect.CodeInvalidArgument, err), fe.Field, fe.Reason)
	case errors.Is(err, storage.ErrNotFound):
		return connect.NewError(connect.CodeNotFound, err)
	case errors.Is(err, claims.ErrClaimSuperseded), errors.Is(err, claims.ErrTaskTerminal), errors.Is(err, claims.ErrPastDeadline):
		return connect.NewError(connect.CodeFailedPrecondition, err)
	case errors.Is(err, claims.ErrNotLeader), errors.Is(err, storage.ErrPartitionDropped):
		return connect.NewError(connect.CodeUnavailable, err)
	case errors.Is(err, storage.ErrCorrupt):
		return connect.NewError(connect.CodeDataLoss, err)
	}
	return connect.NewError(connect.CodeInternal, err)
}

// Message is err's message without connect's code prefix.
func Message(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
}
