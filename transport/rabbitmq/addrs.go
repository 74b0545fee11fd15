package rabbitmq

import (
	"errors"
	"fmt"
	"strings"
)

// splitURLs splits New's url into its addresses: several full amqp:// or
// amqps:// URLs may be given separated by commas (a comma inside a URL is
// only taken as a separator when a scheme follows it, so a password with
// a comma stays whole). Spaces around each address are trimmed.
func splitURLs(raw string) []string {
	var out []string
	rest := raw
	for {
		i := nextSeparator(rest)
		if i < 0 {
			out = append(out, strings.TrimSpace(rest))
			return out
		}
		out = append(out, strings.TrimSpace(rest[:i]))
		rest = rest[i+1:]
	}
}

// nextSeparator returns the index of the first comma in s that is followed
// (after optional spaces) by "amqp://" or "amqps://", or -1.
func nextSeparator(s string) int {
	for i := 0; i < len(s); i++ {
		if s[i] != ',' {
			continue
		}
		next := strings.ToLower(strings.TrimLeft(s[i+1:], " \t"))
		if strings.HasPrefix(next, "amqp://") || strings.HasPrefix(next, "amqps://") {
			return i
		}
	}
	return -1
}

// addresses is the ordered list of broker addresses the transport may
// connect to, each with what hides its password.
type addresses struct {
	urls    []string
	secrets []secret
	all     secret // hides every address's password
}

// parseAddresses validates New's url (one address or several, comma-
// separated) followed by Config.URLs. Every invalid address is reported
// (redacted); an address listed twice is an error too.
func parseAddresses(primary string, more []string) (addresses, error) {
	var raw []string
	if strings.TrimSpace(primary) != "" || len(more) == 0 {
		raw = append(raw, splitURLs(primary)...)
	}
	for _, m := range more {
		raw = append(raw, splitURLs(m)...)
	}
	var a addresses
	var errs []error
	seen := map[string]int{}
	for i, u := range raw {
		sec, err := parseURL(u)
		if err != nil {
			if len(raw) > 1 {
				err = fmt.Errorf("address %d of %d: %w", i+1, len(raw), err)
			}
			errs = append(errs, err)
			continue
		}
		if j, dup := seen[sec.redacted]; dup {
			errs = append(errs, fmt.Errorf("rabbitmq: address %d (%s) repeats address %d; list each broker node once", i+1, sec.redacted, j+1))
			continue
		}
		seen[sec.redacted] = i
		a.urls = append(a.urls, u)
		a.secrets = append(a.secrets, sec)
		a.all.replace = append(a.all.replace, sec.replace...)
	}
	if len(errs) > 0 {
		return addresses{}, errors.Join(errs...)
	}
	return a, nil
}

// redacted lists every address with its password hidden.
func (a addresses) redacted() []string {
	out := make([]string, len(a.secrets))
	for i, s := range a.secrets {
		out[i] = s.redacted
	}
	return out
}

// order returns the indexes of the addresses in the order to try them,
// starting with start and wrapping around.
func (a addresses) order(start int) []int {
	n := len(a.urls)
	out := make([]int, n)
	for i := range out {
		out[i] = (start + i) % n
	}
	return out
}

// dialErrors is the error of a round of connection attempts that failed on
// every address: it names each address (redacted) with its own error.
type dialErrors struct {
	addrs []string
	errs  []error
}

func (e *dialErrors) Error() string {
	if len(e.addrs) == 1 {
		return e.errs[0].Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "no broker answered (%d addresses tried)", len(e.addrs))
	for i, a := range e.addrs {
		fmt.Fprintf(&b, "; %s: %v", a, e.errs[i])
	}
	return b.String()
}

// Unwrap exposes each address's error to errors.Is and errors.As.
func (e *dialErrors) Unwrap() []error { return e.errs }
