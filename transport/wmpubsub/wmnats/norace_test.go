//go:build !race

package wmnats_test

const raceEnabled = false
