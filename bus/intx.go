package bus

import (
	"context"
	"errors"

	"gorm.io/gorm"

	"github.com/barewire-go/barewire/gormstore"
	"github.com/barewire-go/barewire/outbox"
	"github.com/barewire-go/barewire/transport"
)

// deliverInTx writes m in tx through the transport when the transport can
// (transport.TxDeliverer). done is false when the caller must use the
// outbox: the transport cannot write in transactions, tx is on another
// database, the transport is closed, or the message is scheduled (a
// transport's queue has no due time: the outbox holds it until then).
func (b *Bus) deliverInTx(ctx context.Context, tx *gorm.DB, m *outbox.Message, scheduled bool) (done bool, err error) {
	td, ok := b.tr.(transport.TxDeliverer)
	if !ok || scheduled {
		return false, nil
	}
	err = td.DeliverTx(gormstore.WithTx(ctx, tx), []*outbox.Message{m})
	if errors.Is(err, transport.ErrTxUnsupported) || errors.Is(err, outbox.ErrTransportUnavailable) {
		return false, nil
	}
	return true, err
}
