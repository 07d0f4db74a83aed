package servers

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"strconv"
	"strings"
	"time"
)

// etcdKind: an etcd cluster member. Its data directory is inside the
// container, so it survives Stop and Kill (the container keeps its
// filesystem) and a restarted member rejoins with its data; etcd ignores the
// --initial-cluster flags once the data directory exists.
//
// Timing is etcd's default (100ms heartbeat, 1s election timeout): elections
// after a leader dies take about a second, and the server's minimum lease TTL
// is 2s (shorter TTLs are raised to it).
//
// In host mode every member listens on 127.0.0.1 with client and peer ports
// chosen up front. In bridge mode the members share a network of their own
// and reach each other as http://<name>:2380 (their network aliases); only
// the client port 2379 is published. CI machines that need stand-in images
// run host mode; bridge mode differs only in those addresses and is built to
// be correct from Docker's documented aliases and port publishing (it also
// passes this package's tests with the stand-in image on an engine whose
// port publishing works).
var etcdKind = &kind{
	name:         "etcd",
	imageEnv:     "DLOCK_ETCD_IMAGE",
	defaultImage: "quay.io/coreos/etcd:v3.7.3",
	ports:        []int{2379, 2380}, // client, peer
	cluster:      true,
	cmd: func(p *plan, i int) []string {
		url := func(host string, port int) string {
			return "http://" + host + ":" + strconv.Itoa(port)
		}
		initial := make([]string, len(p.members))
		for j, m := range p.members {
			initial[j] = m.name + "=" + url(m.host, m.ports[1])
		}
		m := p.members[i]
		return []string{
			// The official image's path; stand-ins put it there too.
			"/usr/local/bin/etcd",
			"--name=" + m.name,
			"--data-dir=/var/lib/etcd/" + m.name,
			"--listen-client-urls=" + url(m.bind, m.ports[0]),
			"--advertise-client-urls=" + url(m.host, m.ports[0]),
			"--listen-peer-urls=" + url(m.bind, m.ports[1]),
			"--initial-advertise-peer-urls=" + url(m.host, m.ports[1]),
			"--initial-cluster=" + strings.Join(initial, ","),
			"--initial-cluster-token=dlock-" + p.id,
			"--initial-cluster-state=new",
			"--heartbeat-interval=100",
			"--election-timeout=1000",
			"--logger=zap",
			"--log-outputs=stderr",
		}
	},
	// Printed (as a JSON log record) once per client listener when the
	// member has joined the cluster and serves clients; with one client URL,
	// once per start. A member of a multi-member cluster prints it only once
	// a quorum of members runs.
	readyLog: literal(`"msg":"ready to serve client requests"`),
}

// EtcdCluster is an etcd cluster (version 3.7 by default) whose members run
// in containers of their own, without authentication, and without TLS
// unless started by [StartEtcdTLS].
//
// Each member is a [Server], so the fault controls work on members; a member
// brought back by [Server.Start] after Stop or Kill rejoins with its data.
// Start waits until the member serves clients, which needs a quorum of
// members running: to bring back a majority that was stopped, start the
// members concurrently.
type EtcdCluster struct {
	// Members are the cluster's members (named etcd0, etcd1, ... in etcd).
	// Server.Addr of a member is its client endpoint.
	Members []*Server

	// CAPEM is the PEM certificate of the CA that issued the members'
	// server certificate, for a cluster from [StartEtcdTLS]; nil otherwise.
	CAPEM []byte

	g *group
}

// Endpoints returns the members' client endpoints (127.0.0.1:port, in the
// order of Members), for go.etcd.io/etcd/client/v3's Config.Endpoints. In
// bridge mode a restarted member may be published on another port; call
// Endpoints again after Start.
func (c *EtcdCluster) Endpoints() []string {
	eps := make([]string, len(c.Members))
	for i, s := range c.Members {
		eps[i] = s.Addr()
	}
	return eps
}

// String returns a short description for test logs.
func (c *EtcdCluster) String() string {
	return fmt.Sprintf("etcd%v", c.Endpoints())
}

// Terminate stops every member, removes their containers, and removes the
// cluster's network if it has one. Terminating twice is harmless.
func (c *EtcdCluster) Terminate(ctx context.Context) error {
	return c.g.terminate(ctx)
}

func newEtcdCluster(g *group) *EtcdCluster {
	return &EtcdCluster{Members: g.servers, g: g}
}

// StartEtcd starts an etcd cluster of n members (n = 1: a single node) and
// waits until every member serves clients. The caller owns the cluster and
// should Terminate it; [Main] removes any left over.
func StartEtcd(ctx context.Context, n int) (*EtcdCluster, error) {
	g, err := startCluster(ctx, etcdKind, n)
	if err != nil {
		return nil, err
	}
	return newEtcdCluster(g), nil
}

// StartEtcdTLS starts an etcd cluster as [StartEtcd] does, serving clients
// over TLS (members talk to each other in plain HTTP). The server
// certificate, for 127.0.0.1 and localhost, is issued by a CA made for this
// cluster; its certificate is the cluster's CAPEM, for the clients to trust.
func StartEtcdTLS(ctx context.Context, n int) (*EtcdCluster, error) {
	const certFile, keyFile = "/etc/dlock-etcd-server.pem", "/etc/dlock-etcd-server-key.pem"
	ca, cert, key, err := newTLSCert()
	if err != nil {
		return nil, err
	}
	k := *etcdKind
	k.files = map[string][]byte{certFile: cert, keyFile: key}
	k.cmd = func(p *plan, i int) []string {
		args := etcdKind.cmd(p, i)
		for j, a := range args {
			if strings.HasPrefix(a, "--listen-client-urls=") || strings.HasPrefix(a, "--advertise-client-urls=") {
				args[j] = strings.Replace(a, "=http://", "=https://", 1)
			}
		}
		return append(args, "--cert-file="+certFile, "--key-file="+keyFile)
	}
	g, err := startCluster(ctx, &k, n)
	if err != nil {
		return nil, err
	}
	c := newEtcdCluster(g)
	c.CAPEM = ca
	return c, nil
}

// newTLSCert makes a CA and a server certificate it issued for 127.0.0.1
// and localhost, valid for a day, and returns them and the server's key in
// PEM.
func newTLSCert() (caPEM, certPEM, keyPEM []byte, err error) {
	fail := func(err error) ([]byte, []byte, []byte, error) {
		return nil, nil, nil, fmt.Errorf("servers: making a test certificate: %w", err)
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fail(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "dlock test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return fail(err)
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fail(err)
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "localhost"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caTmpl, &srvKey.PublicKey, caKey)
	if err != nil {
		return fail(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		return fail(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}
