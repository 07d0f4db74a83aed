package fence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/backend"
	"github.com/dlock-go/dlock/internal/fencecheck"
)

// SQLTable fences writes to the rows of one SQL table (PostgreSQL, or any
// database with INSERT … ON CONFLICT … DO UPDATE … WHERE and $n
// placeholders). Each row keeps the highest token written to it:
//
//	CREATE TABLE orders (
//	    id          text PRIMARY KEY,    -- KeyColumn
//	    body        text,                -- ValueColumn
//	    fence_token bigint NOT NULL      -- TokenColumn
//	);
//
// Set is one statement, an upsert whose update applies only when the stored
// token is not higher:
//
//	INSERT INTO orders (id, body, fence_token) VALUES ($1, $2, $3)
//	ON CONFLICT (id) DO UPDATE SET body = EXCLUDED.body, fence_token = EXCLUDED.fence_token
//	WHERE orders.fence_token <= EXCLUDED.fence_token
//
// so the check and the write are atomic under any isolation level. The
// names are quoted as given, so they are case-sensitive (PostgreSQL folds
// unquoted names to lower case: create the table with lower-case names);
// the token column must be NOT NULL, and an exact integer type (bigint, as
// above): a float or double column, or a comparison through one, cannot
// tell tokens beyond 2^53 apart (2^53 would pass after 2^53+1).
type SQLTable struct {
	// DB is a *sql.DB, or a *sql.Tx to fence a write inside the
	// caller's own transaction.
	DB          DB
	Table       string // the table name
	KeyColumn   string // the primary key (or a unique column)
	ValueColumn string // the column Set writes
	TokenColumn string // default "fence_token"
}

// DB is what SQLTable needs of a database: *sql.DB and *sql.Tx have it.
type DB interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Set writes value to the row of key if token is at least the highest token
// a write to that row has carried (equal tokens pass), inserting the row if
// it is missing. A lower token gets a *StaleError and changes nothing. Bad
// table or column names wrap dlock.ErrInvalidConfig; database errors wrap
// dlock.ErrUnavailable.
func (t SQLTable) Set(ctx context.Context, key, value string, token dlock.Token) error {
	if err := fencecheck.Set("sql", key, uint64(token), t.DB == nil); err != nil {
		return err
	}
	if token > 1<<63-1 {
		return fmt.Errorf("%w: fence: token %d does not fit a bigint column", backend.ErrInvalidConfig, token)
	}
	tc := t.TokenColumn
	if tc == "" {
		tc = "fence_token"
	}
	for _, id := range []string{t.Table, t.KeyColumn, t.ValueColumn, tc} {
		if !identifier.MatchString(id) {
			return fmt.Errorf("%w: fence: SQL identifier %q: want letters, digits and _", backend.ErrInvalidConfig, id)
		}
	}
	q := fmt.Sprintf(`INSERT INTO %[1]q (%[2]q, %[3]q, %[4]q) VALUES ($1, $2, $3)
ON CONFLICT (%[2]q) DO UPDATE SET %[3]q = EXCLUDED.%[3]q, %[4]q = EXCLUDED.%[4]q
WHERE %[1]q.%[4]q <= EXCLUDED.%[4]q`, t.Table, t.KeyColumn, t.ValueColumn, tc)
	res, err := t.DB.ExecContext(ctx, q, key, value, int64(token))
	if err != nil {
		return fmt.Errorf("%w: fence: sql: %w", backend.ErrUnavailable, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("%w: fence: sql: %w", backend.ErrUnavailable, err)
	}
	if n == 1 {
		return nil
	}
	var highest int64
	err = t.DB.QueryRowContext(ctx, fmt.Sprintf(`SELECT %q FROM %q WHERE %q = $1`, tc, t.Table, t.KeyColumn), key).Scan(&highest)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%w: fence: sql: reading the stored token: %w", backend.ErrUnavailable, err)
	}
	return &StaleError{Resource: key, Token: token, Highest: dlock.Token(highest)}
}
