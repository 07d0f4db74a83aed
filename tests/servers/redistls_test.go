package servers_test

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/tests/servers"
)

// StartRedisTLS serves RESP over TLS only, under a certificate the returned
// CA issued for 127.0.0.1: a client trusting the CA gets PONG, a plain-text
// client does not.
func TestStartRedisTLS(t *testing.T) {
	ss, ca := servers.RedisTLS(t, 1)
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		t.Fatalf("no certificate in the CA PEM %q", ca)
	}
	ping := func(c net.Conn) (string, error) {
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := c.Write([]byte("PING\r\n")); err != nil {
			return "", err
		}
		return bufio.NewReader(c).ReadString('\n')
	}
	c, err := tls.Dial("tcp", ss[0].Addr(), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := ping(c); err != nil || got != "+PONG\r\n" {
		t.Errorf("PING over TLS: %q, %v; want +PONG", got, err)
	}
	p, err := net.Dial("tcp", ss[0].Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if got, _ := ping(p); strings.Contains(got, "PONG") {
		t.Errorf("PING in plain text answered %q; want no plain-text service", got)
	}
}
