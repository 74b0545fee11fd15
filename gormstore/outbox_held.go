package gormstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/outbox"
)

var _ outbox.BatchClaimer = (*Outbox)(nil)

// ClaimBatch implements outbox.BatchClaimer. On PostgreSQL the claimed rows
// are locked (FOR UPDATE SKIP LOCKED) in a transaction that stays open
// until Settle commits it: claiming writes nothing (no lease), another
// relay skips the rows while they are held, and a relay that dies gives
// them back with its connection. hold becomes the transaction's
// idle_in_transaction_session_timeout, so a relay that froze mid-batch
// (a paused process, a cut network) loses its connection and its rows
// after hold, as an expired lease would. On SQLite, which has one writer
// at a time, a batch is leased as by outbox.ClaimLeased.
func (o *Outbox) ClaimBatch(ctx context.Context, owner string, limit int, hold time.Duration) (outbox.Batch, error) {
	if o.s.dialect.name != DialectPostgres {
		return outbox.ClaimLeased(ctx, o, owner, limit, hold)
	}
	if owner == "" {
		return nil, errors.New("gormstore: outbox claim: owner must not be empty")
	}
	if limit <= 0 {
		return nil, fmt.Errorf("gormstore: outbox claim: limit must be positive, got %d", limit)
	}
	if hold <= 0 {
		return nil, fmt.Errorf("gormstore: outbox claim: hold must be positive, got %v", hold)
	}
	// The transaction outlives ctx's cancellation (database/sql would roll
	// it back the moment ctx is done, before confirmed rows are marked);
	// each statement still runs under the context it is given.
	tx := o.s.db.WithContext(context.WithoutCancel(ctx)).Begin()
	if tx.Error != nil {
		return nil, fmt.Errorf("gormstore: outbox claim: %w", tx.Error)
	}
	ms := min(hold.Milliseconds(), math.MaxInt32)
	var rows []outboxRow
	err := tx.WithContext(ctx).Raw(o.claimHeldSQL, strconv.FormatInt(max(ms, 1), 10), limit).Scan(&rows).Error
	if err != nil {
		tx.Rollback()
		return nil, fmt.Errorf("gormstore: outbox claim: %w", err)
	}
	msgs, err := toMessages(rows, true)
	if err != nil || len(msgs) == 0 {
		tx.Rollback()
		if err != nil {
			return nil, err
		}
		return heldBatch{}, nil
	}
	return heldBatch{o: o, tx: tx, msgs: msgs}, nil
}

// heldBatch is a batch whose rows are locked by tx.
type heldBatch struct {
	o    *Outbox
	tx   *gorm.DB
	msgs []*outbox.Message
}

func (b heldBatch) Messages() []*outbox.Message { return b.msgs }

// Settle writes s in the batch's transaction and commits it; rows s does
// not name were never written and are released by the commit.
func (b heldBatch) Settle(ctx context.Context, s outbox.Settlement) error {
	if b.tx == nil {
		return nil
	}
	if err := b.settle(ctx, s); err != nil {
		b.tx.Rollback()
		return fmt.Errorf("gormstore: outbox settle: %w", err)
	}
	return nil
}

func (b heldBatch) settle(ctx context.Context, s outbox.Settlement) error {
	o, tx := b.o, b.tx.WithContext(ctx)
	if len(s.Delivered) > 0 {
		q := o.markHeldSQL
		if s.Delete {
			q = o.deleteHeldSQL
		}
		if err := tx.Exec(q, s.Delivered).Error; err != nil {
			return err
		}
	}
	for _, f := range s.Failed {
		err := tx.Exec(o.failHeldSQL, sanitizeError(f.Error), o.s.dialect.shift(max(f.RetryAfter, 0)),
			f.MaxAttempts, f.MaxAttempts, f.ID).Error
		if err != nil {
			return err
		}
	}
	if len(s.Later) > 0 {
		if err := tx.Exec(o.laterHeldSQL, o.s.dialect.shift(max(s.LaterAfter, 0)), s.Later).Error; err != nil {
			return err
		}
	}
	return tx.Commit().Error
}
