package testenv

import (
	"sync"
	"testing"

	"gorm.io/gorm"
)

// HoldInTransaction runs take in a transaction of db and keeps that
// transaction open, with whatever take locked (a row, an advisory lock),
// until release is called: a session that holds a lock and does nothing,
// as a frozen process's does. release ends the transaction and returns its
// error; the test's cleanup releases it if the test did not. A take that
// fails fails the test.
func HoldInTransaction(t testing.TB, db *gorm.DB, take func(tx *gorm.DB) error) (release func() error) {
	t.Helper()
	holding := make(chan error, 1)
	done := make(chan struct{})
	held := make(chan error, 1)
	go func() {
		held <- db.Transaction(func(tx *gorm.DB) error {
			err := take(tx)
			holding <- err
			if err != nil {
				return err
			}
			<-done
			return nil
		})
	}()
	if err := <-holding; err != nil {
		<-held
		t.Fatalf("take a lock to hold: %v", err)
	}
	var once sync.Once
	var err error
	release = func() error {
		once.Do(func() {
			close(done)
			err = <-held
		})
		return err
	}
	t.Cleanup(func() { _ = release() })
	return release
}
