// Package plumb holds Token, the first parameter of the few exported
// functions that packages of this module call on each other but services
// must not (endpoint.NewDelivery, Registration.Handle and WrapHandle, for
// the bus and bustest). A package outside this module cannot name an
// internal type, so it cannot call them: they are internal in effect,
// while living next to the types they build.
package plumb

// Token is the key: pass Token{}.
type Token struct{}
