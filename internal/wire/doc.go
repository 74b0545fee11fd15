// Package wire holds the header names and small helpers shared by the
// framework's leaf packages. It is internal: users see the same names
// re-exported from package bus.
package wire
