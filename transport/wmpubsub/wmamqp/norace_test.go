//go:build !race

package wmamqp_test

const raceEnabled = false
