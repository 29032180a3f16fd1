package rails

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/ledgerline/outbox/internal/strictjson"
)

// maxConfigBytes bounds a configuration document; real ones are a few KiB.
const maxConfigBytes = 1 << 20

// LoadConfig reads and checks a configuration file (see [ParseConfig]).
// Errors start with the path.
func LoadConfig(path string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("rails config: %w", err)
	}
	defer f.Close()
	c, err := ParseConfig(f)
	if err != nil {
		return nil, fmt.Errorf("rails config %s: %w", path, err)
	}
	return c, nil
}

// ParseConfig decodes a JSON configuration and checks it with
// [Config.Validate]. Decoding is strict: unknown fields (at any depth, and
// names are case-sensitive), repeated keys, invalid UTF-8, trailing data
// and values of the wrong JSON type are errors. Every error names where it is, e.g.
// `rails[2] (type "ach"): breaker: unknown field "open"`; when several
// things are wrong, all of them are reported (one per line).
func ParseConfig(r io.Reader) (*Config, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading: %w", err)
	}
	if len(data) > maxConfigBytes {
		return nil, fmt.Errorf("the configuration is larger than %d bytes", maxConfigBytes)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("the configuration is empty")
	}
	var top struct {
		Transports map[string]json.RawMessage `json:"transports"`
		Rails      []json.RawMessage          `json:"rails"`
	}
	if err := strictjson.Unmarshal(data, &top); err != nil {
		return nil, documentError(data, err)
	}

	c := &Config{}
	var errs []error
	if top.Transports != nil {
		c.Transports = make(map[string]TransportConfig, len(top.Transports))
	}
	for _, name := range slices.Sorted(maps.Keys(top.Transports)) {
		t, err := decodeTransport(top.Transports[name])
		if err != nil {
			errs = append(errs, at(transportWhere(name), err))
			continue
		}
		c.Transports[name] = t
	}
	for i, raw := range top.Rails {
		rc, err := decodeRail(raw)
		if err != nil {
			errs = append(errs, at(railWhere(i, rc.Type), err))
			continue
		}
		c.Rails = append(c.Rails, rc)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

func decodeTransport(raw json.RawMessage) (TransportConfig, error) {
	var t struct {
		Kind    string          `json:"kind"`
		Sandbox json.RawMessage `json:"sandbox"`
		Webhook json.RawMessage `json:"webhook"`
	}
	if err := strictjson.Unmarshal(raw, &t); err != nil {
		return TransportConfig{}, jsonError(err)
	}
	tc := TransportConfig{Kind: t.Kind}
	if present(t.Sandbox) {
		tc.Sandbox = new(SandboxConfig)
		if err := strictjson.Unmarshal(t.Sandbox, tc.Sandbox); err != nil {
			return tc, fmt.Errorf("sandbox: %w", jsonError(err))
		}
	}
	if present(t.Webhook) {
		tc.Webhook = new(WebhookConfig)
		if err := strictjson.Unmarshal(t.Webhook, tc.Webhook); err != nil {
			return tc, fmt.Errorf("webhook: %w", jsonError(err))
		}
	}
	return tc, nil
}

// decodeRail decodes one rail, its breaker and code table as separate
// layers so an error can say which of them is wrong. On error the returned
// RailConfig still carries the type when it could be read, for the message.
func decodeRail(raw json.RawMessage) (RailConfig, error) {
	type plain RailConfig
	var r struct {
		plain
		Breaker json.RawMessage `json:"breaker"` // shadows plain.Breaker
		Codes   json.RawMessage `json:"codes"`   // shadows plain.Codes
	}
	if err := strictjson.Unmarshal(raw, &r); err != nil {
		var typ struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(raw, &typ) // best effort, only to label the error (raw passed the strict top-level decode)
		return RailConfig{Type: typ.Type}, jsonError(err)
	}
	rc := RailConfig(r.plain)
	if present(r.Breaker) {
		rc.Breaker = new(BreakerConfig)
		if err := strictjson.Unmarshal(r.Breaker, rc.Breaker); err != nil {
			return rc, fmt.Errorf("breaker: %w", jsonError(err))
		}
	}
	if present(r.Codes) {
		var codes map[string]json.RawMessage
		if err := strictjson.Unmarshal(r.Codes, &codes); err != nil {
			return rc, fmt.Errorf("codes: %w", jsonError(err))
		}
		rc.Codes = make(CodeTable, len(codes))
		for _, code := range slices.Sorted(maps.Keys(codes)) {
			var rule CodeRule
			if err := strictjson.Unmarshal(codes[code], &rule); err != nil {
				return rc, fmt.Errorf("codes.%s: %w", code, jsonError(err))
			}
			rc.Codes[code] = rule
		}
	}
	return rc, nil
}

// present reports whether an optional section was given (absent and null
// mean the same).
func present(raw json.RawMessage) bool {
	return len(raw) > 0 && !bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

// documentError describes an error of the top-level decoding: a syntax
// error with its line and column, a repeated key with where it is.
func documentError(data []byte, err error) error {
	var e *strictjson.Error
	if !errors.As(err, &e) {
		return err
	}
	switch e.Reason {
	case strictjson.ReasonSyntax, strictjson.ReasonInvalidUTF8:
		if e.Offset >= 0 {
			line, col := lineCol(data, e.Offset)
			return fmt.Errorf("invalid JSON at line %d, column %d: %s", line, col, e.Error())
		}
		return fmt.Errorf("invalid JSON: %s", e.Error())
	case strictjson.ReasonDuplicate:
		return at(pointerWhere(e.Parent()), fmt.Errorf("key %q appears twice", e.Name))
	}
	return fmt.Errorf("top level: %w", jsonError(err))
}

// pointerWhere renders a JSON pointer the way configuration errors name
// places: /rails/2/breaker is rails[2].breaker, "" is the top level.
func pointerWhere(pointer string) string {
	if pointer == "" {
		return "top level"
	}
	var b strings.Builder
	for _, tok := range strings.Split(strings.TrimPrefix(pointer, "/"), "/") {
		tok = strings.NewReplacer("~1", "/", "~0", "~").Replace(tok)
		if _, err := strconv.Atoi(tok); err == nil {
			fmt.Fprintf(&b, "[%s]", tok)
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(tok)
	}
	return b.String()
}

func lineCol(data []byte, offset int64) (line, col int) {
	offset = min(max(offset, 0), int64(len(data)))
	before := data[:offset]
	line = bytes.Count(before, []byte("\n")) + 1
	col = int(offset) - (bytes.LastIndexByte(before, '\n') + 1)
	return line, max(col, 1)
}

// jsonError rewords a decoding error for a configuration reader: the
// location prefix is added by the caller (layers are decoded separately, so
// the member's own name is the one to show).
func jsonError(err error) error {
	var e *strictjson.Error
	if errors.As(err, &e) && e.Reason == strictjson.ReasonUnknown {
		return fmt.Errorf("unknown field %q", e.Name)
	}
	return err
}
