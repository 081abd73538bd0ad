package node

import "strconv"

func itoa(v uint64) string { return strconv.FormatUint(v, 10) }
