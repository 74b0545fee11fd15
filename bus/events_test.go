package bus_test

import (
	"errors"
	"testing"

	"github.com/barewire-go/barewire/bus"
)

func TestWithObserverRefusesNil(t *testing.T) {
	t.Parallel()
	_, err := bus.New(bus.WithObserver(nil))
	if !errors.Is(err, bus.ErrInvalidOption) {
		t.Fatalf("error %v, want ErrInvalidOption", err)
	}
}
