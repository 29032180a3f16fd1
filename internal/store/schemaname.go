package store

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// DefaultSchema is the schema used when none is configured.
const DefaultSchema = "outbox"

// ErrInvalidSchema is returned for schema names that are not plain
// lower-case identifiers, are SQL keywords, or name a system or shared
// schema (public, information_schema, pg_*).
var ErrInvalidSchema = errors.New("invalid schema name")

// Schema names are restricted to plain identifiers so they can be spliced
// into SQL text without quoting (SQL parameters cannot name a schema).
var schemaPattern = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ValidateSchema checks a schema name; the empty string means [DefaultSchema].
func ValidateSchema(schema string) error {
	if schema == "" {
		return nil
	}
	if !schemaPattern.MatchString(schema) {
		return fmt.Errorf("%w: %q (want lower-case letters, digits and _)", ErrInvalidSchema, schema)
	}
	if why := reservedSchema(schema); why != "" {
		return fmt.Errorf("%w: %q: %s; choose another name", ErrInvalidSchema, schema, why)
	}
	return nil
}

// sqlKeywords are PostgreSQL's keywords that are not "unreserved"
// (pg_get_keywords() catcode R, T or C, PostgreSQL 15). The schema name is
// spliced into SQL text unquoted, and such a word there is a syntax error
// (`CREATE SCHEMA select`) or, worse, parses as something else. A test
// compares this list with the running server's, so a server that knows more
// keywords is noticed.
var sqlKeywords = makeSet(`all analyse analyze and any array as asc asymmetric authorization
between bigint binary bit boolean both case cast char character check coalesce collate collation
column concurrently constraint create cross current_catalog current_date current_role
current_schema current_time current_timestamp current_user dec decimal default deferrable desc
distinct do else end except exists extract false fetch float for foreign freeze from full grant
greatest group grouping having ilike in initially inner inout int integer intersect interval into
is isnull join lateral leading least left like limit localtime localtimestamp national natural
nchar none normalize not notnull null nullif numeric offset on only or order out outer overlaps
overlay placing position precision primary real references returning right row select
session_user setof similar smallint some substring symmetric table tablesample then time
timestamp to trailing treat trim true union unique user using values varchar variadic verbose
when where window with xmlattributes xmlconcat xmlelement xmlexists xmlforest xmlnamespaces
xmlparse xmlpi xmlroot xmlserialize xmltable`)

// systemSchemas are schemas the outbox must never take over: PostgreSQL's
// own (pg_catalog, pg_toast, ... are covered by the pg_ prefix, which
// PostgreSQL reserves) and public, which every role can create objects in
// by default on older servers and which holds other applications' tables.
var systemSchemas = makeSet(`public information_schema`)

func makeSet(words string) map[string]bool {
	m := make(map[string]bool)
	for _, w := range strings.Fields(words) {
		m[w] = true
	}
	return m
}

// reservedSchema says why a well-formed name cannot be the outbox schema,
// or returns "".
func reservedSchema(schema string) string {
	switch {
	case sqlKeywords[schema]:
		return "it is an SQL keyword"
	case systemSchemas[schema], strings.HasPrefix(schema, "pg_"):
		return "it is a system or shared schema"
	}
	return ""
}
