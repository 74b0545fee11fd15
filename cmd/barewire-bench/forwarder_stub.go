//go:build !watermillamqp

package main

import (
	"context"
	"errors"
)

// forwarderBuilt reports whether the Watermill forwarder pipeline is
// compiled in (it needs the watermillamqp build tag; see build.sh).
const forwarderBuilt = false

var errNoForwarder = errors.New("built without watermill-amqp: build with ./cmd/barewire-bench/build.sh (tag watermillamqp) to run the Watermill forwarder")

type noForwarder struct{}

func newForwarder(*config, *env, *tracker, string, fwdMode) pipeline { return noForwarder{} }

func (noForwarder) Name() string                                    { return "watermill-forwarder" }
func (noForwarder) Start(context.Context) error                     { return errNoForwarder }
func (noForwarder) Produce(context.Context, string, benchMsg) error { return errNoForwarder }
func (noForwarder) Verify(context.Context) (int64, int64, error)    { return 0, 0, errNoForwarder }
func (noForwarder) Close(context.Context) error                     { return nil }

var errNoForwarderBuild = errNoForwarder
