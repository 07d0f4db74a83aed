package zookeeper

import (
	"strings"
)

// encodeKey turns any key the dlock layer accepts (non-empty UTF-8 without
// NUL) into one valid ZooKeeper path segment: bytes outside [A-Za-z0-9_~.-]
// are percent-encoded (so "/" cannot split the segment, and control,
// surrogate and private-use characters, which ZooKeeper rejects, never
// appear), and the segments "." and "..", which ZooKeeper rejects, are
// spelled %2E and %2E%2E. The encoding is injective: distinct keys get
// distinct segments.
func encodeKey(key string) string {
	if key == "." || key == ".." {
		return strings.Repeat("%2E", len(key))
	}
	var b strings.Builder
	for i := 0; i < len(key); i++ {
		c := key[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9',
			c == '_', c == '~', c == '.', c == '-':
			b.WriteByte(c)
		default:
			const hex = "0123456789ABCDEF"
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		}
	}
	return b.String()
}
