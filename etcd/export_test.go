package etcd

// WarnTransport is the warning of a URL's client that sends its password
// in clear text.
var WarnTransport = warnTransport
