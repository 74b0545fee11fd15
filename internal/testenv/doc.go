// Package testenv gives integration tests their service addresses. Without
// the environment variable a test skips and says which variable to set;
// under CI (CI=true) a missing variable fails the test instead, so that an
// integration test can never pass CI by skipping. It also gives tests a
// PostgreSQL schema of their own, a catalog to compare schemas by, and a way
// to apply migration files as a plain-SQL migration tool would.
package testenv
