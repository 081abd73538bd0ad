package storage

// dueKey names one in-memory time index of one partition (the delayed,
// claimed and deadline indexes: timeIndex).
type dueKey struct {
	p   uint16
	tag byte
}
