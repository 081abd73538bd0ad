// Package apierr is the one place where Norn's internal errors become the
// API's: connect codes (DESIGN section 6) that clients classify and retry
// by.
//
// Every part of a node that answers a request returns errors through it:
//
//	if err := spec.Validate(limits); err != nil {
//		return apierr.From(err) // *crdt.FieldError -> INVALID_ARGUMENT (sizes too)
//	}
//	return apierr.Invalid("lease", "must be positive, got %s", apierr.Duration(d))
//
// From maps the sentinel errors of the layers below (storage.ErrNotFound
// -> NOT_FOUND, claims.ErrNotLeader -> UNAVAILABLE, claims.ErrClaimSuperseded
// -> FAILED_PRECONDITION, storage.ErrCorrupt -> DATA_LOSS, the rest
// INTERNAL) and lets errors that already carry a code pass. Invalid names
// the offending field first in the message, as every validation error at
// the API edge does, with durations as the API takes them (Duration:
// "3600s", not Go's "1h0m0s"). Message strips connect's code prefix when one
// error's text is embedded in another's.
package apierr
