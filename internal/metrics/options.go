package metrics

import (
	"fmt"
	"net"
	"strconv"
)

// Options is the metrics section of config.yaml.
type Options struct {
	// Listen is the HOST:PORT the Prometheus endpoint listens on ("" is
	// off). It serves /metrics over plain HTTP: keep it on a loopback or
	// a node-internal address.
	Listen string `yaml:"listen"`
}

// Validate checks the options, naming the config key at fault.
func (o *Options) Validate() error {
	if o.Listen == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(o.Listen)
	if err != nil {
		return fmt.Errorf("metrics.listen: %q is not HOST:PORT (e.g. 127.0.0.1:9464): %v", o.Listen, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("metrics.listen: %q: port %q is not a number in 0..65535", o.Listen, port)
	}
	if host != "" && net.ParseIP(host) == nil && host != "localhost" {
		return fmt.Errorf("metrics.listen: %q: host %q is not an IP address or localhost", o.Listen, host)
	}
	return nil
}
