package zookeeper

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/dlock-go/dlock/backend"
)

// checkPrefix checks a lock prefix (Options.Prefix, or a zk:// URL's path)
// as ZooKeeper checks a path (PathUtils.validatePath), before any I/O: an
// absolute path of non-empty elements, none "." or "..", without NUL or the
// characters ZooKeeper refuses (controls, surrogates, private use,
// U+FFF0-U+FFFF), not at the root nor under /zookeeper (the server's own
// subtree).
func checkPrefix(p string) error {
	bad := func(why string) error {
		return fmt.Errorf("%w: zookeeper: Prefix %q: %s (want an absolute path such as /dlock)", backend.ErrInvalidConfig, p, why)
	}
	if !strings.HasPrefix(p, "/") || p == "/" {
		return bad("not an absolute path below /")
	}
	if !utf8.ValidString(p) {
		return bad("not UTF-8")
	}
	for _, r := range p {
		if r == 0 || r < 0x20 || (r >= 0x7f && r <= 0x9f) || (r >= 0xd800 && r <= 0xf8ff) || (r >= 0xfff0 && r <= 0xffff) {
			return bad(fmt.Sprintf("character %U not allowed", r))
		}
	}
	for _, e := range strings.Split(p[1:], "/") {
		switch e {
		case "":
			return bad("empty element (// or a trailing slash)")
		case ".", "..":
			return bad("element " + e + " not allowed")
		}
	}
	if p == "/zookeeper" || strings.HasPrefix(p, "/zookeeper/") {
		return bad("/zookeeper is the server's own subtree")
	}
	return nil
}

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
