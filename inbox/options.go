package inbox

import (
	"fmt"
	"time"
)

// Defaults, matching BareWire's.
const (
	DefaultLockTimeout     = 30 * time.Second
	DefaultRetention       = 7 * 24 * time.Hour
	DefaultCleanupInterval = time.Hour
)

// ValidateTimes checks the relation BareWire requires between the inbox
// options: retention must exceed the lock timeout, or a crashed delivery's
// lock row could be cleaned up before its redelivery arrives.
func ValidateTimes(lockTimeout, retention time.Duration) error {
	if lockTimeout <= 0 {
		return fmt.Errorf("InboxLockTimeout %v must be positive", lockTimeout)
	}
	if retention <= lockTimeout {
		return fmt.Errorf("InboxRetention %v must be greater than InboxLockTimeout %v", retention, lockTimeout)
	}
	return nil
}
