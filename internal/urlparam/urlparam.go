// Package urlparam reads the parameters of a backend's URL, the one way
// every backend does.
package urlparam

import (
	"fmt"
	"net/url"

	"github.com/dlock-go/dlock/backend"
)

// Take removes the parameter name from q and returns its value. ok is false
// if it is absent; it is an error wrapping backend.ErrInvalidConfig if it is
// given more than once or empty.
// Backends take their known parameters, then reject whatever is left.
func Take(q url.Values, name string) (value string, ok bool, err error) {
	v, ok := q[name]
	if !ok {
		return "", false, nil
	}
	q.Del(name)
	if len(v) != 1 || v[0] == "" {
		return "", false, fmt.Errorf("%w: parameter %s: want one non-empty value (leave it out for the default)", backend.ErrInvalidConfig, name)
	}
	return v[0], true, nil
}
