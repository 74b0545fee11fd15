// Package postgresdb opens a PostgreSQL database for the bus: GORM with
// gorm.io/driver/postgres (pgx), its logger silent and its pool bounded.
// It is a package of its own so that services on the embedded SQLite
// default, which import gormstore, do not link pgx.
//
// Any *gorm.DB opened with gorm.io/driver/postgres's default pgx driver
// works with the bus; this is a convenience with sensible pool settings.
package postgresdb

import (
	"fmt"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Open opens a PostgreSQL database from a DSN such as
// "host=127.0.0.1 user=app dbname=app sslmode=disable" or a postgres://
// URL, with GORM's logger silent and a pool of at most 20 connections (the
// outbox's Listen holds one for as long as it runs). It pings the server.
func Open(dsn string) (*gorm.DB, error) {
	db, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
	if err != nil {
		closeQuietly(db)
		return nil, fmt.Errorf("postgresdb: open: %w", err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, fmt.Errorf("postgresdb: open: %w", err)
	}
	sqlDB.SetMaxOpenConns(20)
	sqlDB.SetMaxIdleConns(10)
	// Recycling connections now and then lets the pool follow failovers and
	// server-side settings changes.
	sqlDB.SetConnMaxLifetime(30 * time.Minute)
	sqlDB.SetConnMaxIdleTime(5 * time.Minute)
	return db, nil
}

// closeQuietly closes the pool of a database whose opening failed after the
// pool was created (gorm.Open pings after opening), so that its goroutines
// do not leak.
func closeQuietly(db *gorm.DB) {
	if db == nil || db.Config == nil || db.ConnPool == nil {
		return
	}
	if sqlDB, err := db.DB(); err == nil {
		_ = sqlDB.Close()
	}
}
