module github.com/dlock-go/dlock/cmd/dlock

go 1.26.0
