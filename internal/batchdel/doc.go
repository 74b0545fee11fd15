// Package batchdel runs the bounded, repeated delete passes that the inbox
// and outbox cleanup loops share.
package batchdel
