package endpoint

import (
	"errors"
	"fmt"
)

// PermanentError marks a failure that retrying cannot fix: the message goes
// straight to the dead-letter destination. Wrap an error with Permanent.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return "permanent: " + e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err so that the endpoint skips its retries and dead-letters
// the message at once. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	var pe *PermanentError
	if errors.As(err, &pe) {
		return err
	}
	return &PermanentError{Err: err}
}

// IsPermanent reports whether err was wrapped with Permanent.
func IsPermanent(err error) bool {
	var pe *PermanentError
	return errors.As(err, &pe)
}

// ErrUnknownMessageType is returned (as a permanent error) for a message whose
// type no consumer on the endpoint handles.
var ErrUnknownMessageType = errors.New("no consumer for message type")

// ErrInvalidConfig is wrapped by every configuration error the builder collects.
var ErrInvalidConfig = errors.New("invalid configuration")

func configErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
}
