package saga_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv("BW_SAGA_CHILD") != "" {
		sagaChild() // TestTimeoutAfterSIGKILL's child process; never returns
	}
	goleak.VerifyTestMain(m)
}
