package store_test

import (
	"testing"

	"github.com/ledgerline/outbox/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }
