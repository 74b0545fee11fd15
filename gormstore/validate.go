package gormstore

// ValidatePrefix reports whether prefix makes valid table names, so that a
// bad prefix is caught when a bus is configured rather than when it starts.
func ValidatePrefix(prefix string) error { return validatePrefix(prefix) }
