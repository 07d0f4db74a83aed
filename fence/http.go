package fence

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/dlock-go/dlock"
)

// Header is the HTTP request header that carries a fencing token, as a
// decimal number.
const Header = "Fencing-Token"

// SetHeader puts token into h, for a client that calls a fenced service.
func SetHeader(h http.Header, token dlock.Token) {
	h.Set(Header, strconv.FormatUint(uint64(token), 10))
}

// Middleware lets a request through to next only if its Fencing-Token
// header is at least the highest token g has seen for the request's
// resource (resource(r); for example the path). A missing or malformed
// token gets 400 Bad Request, a stale one 409 Conflict, and neither reaches
// next. The check holds for the whole of next, and a request that passes it
// raises the highest token whatever next answers (see [Guard.Do]): put
// authentication before this middleware, so that only holders can raise
// it. The state is g's, in this process only.
func Middleware(g *Guard, resource func(*http.Request) string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, err := strconv.ParseUint(r.Header.Get(Header), 10, 64)
		if err != nil || tok == 0 {
			http.Error(w, "fence: missing or malformed "+Header+" header", http.StatusBadRequest)
			return
		}
		err = g.Do(resource(r), dlock.Token(tok), func() error {
			next.ServeHTTP(w, r)
			return nil
		})
		if errors.Is(err, ErrStaleToken) {
			http.Error(w, err.Error(), http.StatusConflict)
		}
	})
}
