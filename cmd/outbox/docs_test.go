package main

import (
	"bytes"
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/migrations"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/rails"
	"github.com/ledgerline/outbox/relay"
)

// The documents (README.md, docs/*.md, the package doc comments, the
// commands' --help, the messages that cite a section, the alert rules) name
// tests, Go identifiers, repository paths, sections, migrations, commands,
// flags, variables, make targets, error codes, metrics and SQLSTATEs. An
// operator follows them at 3 a.m.: TestDocsReferencesExist checks that
// each one names something that exists (and nothing outside the
// repository), and TestDocsCheckerFindsStale that the checker reports each
// kind of stale name with its file and line. Everything is read from the
// checkout and the binary's own flag sets and collectors: no database, no
// network.

// repoRoot is the repository's top directory, seen from cmd/outbox.
var repoRoot = filepath.Join("..", "..")

// docFinding is one stale reference: where it is and what is wrong.
type docFinding struct {
	file string
	line int
	kind string
	msg  string
}

func (f docFinding) String() string {
	return fmt.Sprintf("%s:%d: %s: %s", f.file, f.line, f.kind, f.msg)
}

// docException is a name a document cites on purpose although it does not
// exist (a name given as a bad example, or one cited as removed). Each is
// tied to its file and says why; an exception no document needs any more
// is itself reported.
type docException struct{ file, kind, name, why string }

var docExceptions = []docException{
	{"internal/pglocal/pglocal.go", "outside", "/tmp/outbox-pg/<pid>-<random>/",
		"where the package puts the clusters it starts (a place it makes, not a document elsewhere)"},
}

// usedExceptions holds the docExceptions some document needed.
var usedExceptions sync.Map

// repoIndex is what the documents' names are checked against.
type repoIndex struct {
	files      map[string]bool            // every file and directory, slash-separated, relative to the root
	declsByDir map[string]map[string]bool // package directory -> top-level names, Type.Method and Type.Field
	dirsByName map[string][]string        // package name (and directory) -> package directories
	funcDirs   map[string][]string        // function name -> directories that declare it
	members    map[string]bool            // Type.Method and Type.Field, of any package
	migrations map[int]string             // migration number -> file name
	flags      map[string]map[string]bool // command -> its flags
	allFlags   map[string]bool
	metrics    map[string]bool // every name a relay service's collectors export
	notMetrics map[string]bool // outbox_* names that are not metrics: roles, JSON fields, the NOTIFY channel
	sqlstates  map[string]bool // SQLSTATEs the code or the migrations name
	headings   map[string][]docHeading
	basenames  map[string]bool   // every file's name
	envVars    map[string]bool   // OUTBOX_* variables: the flags' and those the code or the Makefile reads
	usages     map[string]string // command -> its usage line (its subcommands)
	makeTarget map[string]bool
	codes      map[string]bool   // UPPER_CASE words of the program's sources (error codes, states, settings)
	helps      map[string]string // "outbox <command> --help" -> what it prints
	pkgDocs    map[string]string // file -> its package doc comment, at its lines
	docCites   map[string]string // file -> its string literals that cite a document (messages, help), at their lines
	paths      *regexp.Regexp    // a repository path: one of the root's entries, then a path's characters
}

// docHeading is a Markdown heading: its text and its anchor.
type docHeading struct{ text, anchor string }

var loadRepoIndex = sync.OnceValues(func() (*repoIndex, error) { return indexRepo(repoRoot) })

func indexRepo(root string) (*repoIndex, error) {
	ix := &repoIndex{
		files: map[string]bool{}, declsByDir: map[string]map[string]bool{}, dirsByName: map[string][]string{},
		funcDirs: map[string][]string{}, members: map[string]bool{}, migrations: map[int]string{}, flags: map[string]map[string]bool{},
		allFlags: map[string]bool{}, metrics: map[string]bool{}, notMetrics: map[string]bool{},
		sqlstates: map[string]bool{}, headings: map[string][]docHeading{},
		basenames: map[string]bool{}, envVars: map[string]bool{}, usages: map[string]string{}, makeTarget: map[string]bool{}, codes: map[string]bool{},
		helps: map[string]string{}, pkgDocs: map[string]string{}, docCites: map[string]string{},
	}
	envVar := regexp.MustCompile(`\bOUTBOX_[A-Z0-9_]+`)
	makeTarget := regexp.MustCompile(`(?m)^([a-z][a-z0-9-]*):`)
	fset := token.NewFileSet()
	jsonTag := regexp.MustCompile(`json:"(outbox_[a-z0-9_]+)`)
	sqlRole := regexp.MustCompile(`\boutbox_[a-z0-9_]+`)
	sqlstate := regexp.MustCompile(`'([0-9A-Z]{5})'|"([0-9A-Z]{5})"`)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() && (d.Name() == ".git" || d.Name() == ".data" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		ix.files[rel] = true
		if d.IsDir() {
			return nil
		}
		ix.basenames[d.Name()] = true
		switch path.Ext(rel) {
		case ".go", ".sql", ".html", ".tmpl", ".js", ".css", ".yml":
			if strings.HasSuffix(rel, "_test.go") {
				break
			}
			src, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for _, m := range upperWord.FindAll(src, -1) {
				ix.codes[string(m)] = true
			}
		}
		// This file's stale examples name nothing.
		self := rel == "cmd/outbox/docs_test.go"
		if !self && (strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, ".sh") || rel == "Makefile") {
			src, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for _, m := range envVar.FindAll(src, -1) {
				ix.envVars[string(m)] = true
			}
			if rel == "Makefile" {
				for _, m := range makeTarget.FindAllSubmatch(src, -1) {
					ix.makeTarget[string(m[1])] = true
				}
			}
		}
		switch {
		case strings.HasSuffix(rel, ".go"):
			src, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			f, err := parser.ParseFile(fset, p, src, parser.SkipObjectResolution|parser.ParseComments)
			if err != nil {
				return err
			}
			if f.Doc != nil && !strings.HasSuffix(rel, "_test.go") {
				// Blank lines before it keep the file's line numbers.
				ix.pkgDocs[rel] = strings.Repeat("\n", fset.Position(f.Doc.Pos()).Line-1) + f.Doc.Text()
			}
			ix.addGoFile(path.Dir(rel), f)
			if !strings.HasSuffix(rel, "_test.go") {
				if text := citingLiterals(fset, f); text != "" {
					ix.docCites[rel] = text
				}
			}
			if self {
				return nil
			}
			for _, m := range jsonTag.FindAllSubmatch(src, -1) {
				ix.notMetrics[string(m[1])] = true
			}
			for _, m := range sqlstate.FindAllSubmatch(src, -1) {
				ix.sqlstates[string(m[1])+string(m[2])] = true
			}
		case strings.HasSuffix(rel, ".sql"):
			src, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for _, m := range sqlRole.FindAll(src, -1) {
				ix.notMetrics[string(m)] = true
			}
			for _, m := range sqlstate.FindAllSubmatch(src, -1) {
				ix.sqlstates[string(m[1])+string(m[2])] = true
			}
			if path.Dir(rel) == "migrations/sql" {
				if n, err := strconv.Atoi(strings.SplitN(d.Name(), "_", 2)[0]); err == nil {
					ix.migrations[n] = d.Name()
				}
			}
		case strings.HasSuffix(rel, ".md"):
			src, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			ix.headings[rel] = markdownHeadings(string(src))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	ix.notMetrics[migrations.NotifyChannel] = true
	ix.paths = ix.pathPattern()
	if err := ix.addFlags(); err != nil {
		return nil, err
	}
	if err := ix.addMetrics(); err != nil {
		return nil, err
	}
	return ix, nil
}

func (ix *repoIndex) addGoFile(dir string, f *ast.File) {
	decls := ix.declsByDir[dir]
	if decls == nil {
		decls = map[string]bool{}
		ix.declsByDir[dir] = decls
		ix.dirsByName[dir] = append(ix.dirsByName[dir], dir)
	}
	name := strings.TrimSuffix(f.Name.Name, "_test")
	if !slices.Contains(ix.dirsByName[name], dir) {
		ix.dirsByName[name] = append(ix.dirsByName[name], dir)
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			n := d.Name.Name
			if d.Recv != nil && len(d.Recv.List) > 0 {
				decls["*."+n] = true // pkg.Method, as the documents write a method of the package's type
				n = recvName(d.Recv.List[0].Type) + "." + n
				ix.members[n] = true
			} else {
				ix.funcDirs[n] = append(ix.funcDirs[n], dir)
			}
			decls[n] = true
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					decls[s.Name.Name] = true
					if st, ok := s.Type.(*ast.StructType); ok {
						for _, fl := range st.Fields.List {
							for _, fn := range fl.Names {
								decls[s.Name.Name+"."+fn.Name] = true
								ix.members[s.Name.Name+"."+fn.Name] = true
							}
							if len(fl.Names) == 0 { // embedded: its name is its type's
								decls[s.Name.Name+"."+recvName(fl.Type)] = true
							}
						}
					}
					if it, ok := s.Type.(*ast.InterfaceType); ok {
						for _, m := range it.Methods.List {
							for _, mn := range m.Names {
								decls[s.Name.Name+"."+mn.Name] = true
								ix.members[s.Name.Name+"."+mn.Name] = true
							}
						}
					}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						decls[n.Name] = true
					}
				}
			}
		}
	}
}

// citingLiterals returns a file's string literals that name a document
// (the messages and help texts that send an operator to a section), each
// at its line.
func citingLiterals(fset *token.FileSet, f *ast.File) string {
	var b strings.Builder
	line := 1
	ast.Inspect(f, func(n ast.Node) bool {
		lit, ok := n.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING || !strings.Contains(lit.Value, ".md") {
			return true
		}
		s, err := strconv.Unquote(lit.Value)
		if err != nil {
			return true
		}
		at := fset.Position(lit.Pos()).Line
		for ; line < at; line++ {
			b.WriteByte('\n')
		}
		b.WriteString(strings.ReplaceAll(s, "\n", " ") + " ")
		return true
	})
	return b.String()
}

// recvName is a receiver's or embedded field's type name, without
// pointer, package or type parameters.
func recvName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return recvName(e.X)
	case *ast.IndexExpr:
		return recvName(e.X)
	case *ast.IndexListExpr:
		return recvName(e.X)
	case *ast.SelectorExpr:
		return e.Sel.Name
	case *ast.Ident:
		return e.Name
	}
	return ""
}

// helpFlag is a flag's line in a command's --help.
var helpFlag = regexp.MustCompile(`(?m)^  --([a-z0-9-]+)  \[`)

// addFlags reads every command's flags from its --help, as an operator
// would.
func (ix *repoIndex) addFlags() error {
	for _, c := range commands {
		args := []string{c.name, "--help"}
		if c.name == "sandbox" {
			args = []string{"sandbox", "serve", "--help"}
		}
		var stdout, stderr bytes.Buffer
		env := &environment{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, getenv: func(string) string { return "" }}
		if code := exitCode(env, run(context.Background(), env, args)); code != 0 {
			return fmt.Errorf("outbox %s: exit status %d: %s", strings.Join(args, " "), code, stderr.String())
		}
		set := map[string]bool{"help": true} // the flag package's own
		ix.allFlags["help"] = true
		help := stderr.String() + stdout.String()
		for _, m := range helpFlag.FindAllStringSubmatch(help, -1) {
			set[m[1]] = true
			ix.allFlags[m[1]] = true
			ix.envVars[envName(m[1])] = true
		}
		ix.usages[c.name], _, _ = strings.Cut(help, "\n")
		ix.helps["outbox "+strings.Join(args, " ")] = help
		if len(set) == 0 {
			return fmt.Errorf("outbox %s lists no flags", strings.Join(args, " "))
		}
		ix.flags[c.name] = set
	}
	var stdout bytes.Buffer
	env := &environment{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stdout, getenv: func(string) string { return "" }}
	if err := run(context.Background(), env, []string{"--help"}); err != nil {
		return fmt.Errorf("outbox --help: %w", err)
	}
	ix.helps["outbox --help"] = stdout.String()
	return nil
}

// addMetrics describes every collector of a relay service (as
// deploy's TestRulesAndDashboardUseRealMetrics does); the pool is never
// used, so nothing connects.
func (ix *repoIndex) addMetrics() error {
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: rails.NewSandbox(rails.SandboxOptions{})})
	if err != nil {
		return err
	}
	pool, err := pgxpool.New(context.Background(), "postgres://docs@127.0.0.1:1/docs")
	if err != nil {
		return err
	}
	defer pool.Close()
	svc, err := relay.New(pool, relay.Config{Relayer: engine.Config{Rails: set, PollInterval: time.Second}})
	if err != nil {
		return err
	}
	descs := make(chan *prometheus.Desc, 1000)
	for _, c := range svc.Collectors() {
		c.Describe(descs)
	}
	close(descs)
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range descs {
		m := fqName.FindStringSubmatch(d.String())
		if m == nil {
			return fmt.Errorf("cannot read the name of %s", d)
		}
		for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
			ix.metrics[m[1]+suffix] = true
		}
	}
	return nil
}

// markdownHeadings lists a document's headings (outside code blocks) with
// their anchors as GitHub makes them: lower case, punctuation dropped,
// spaces as dashes, a repeated anchor numbered.
func markdownHeadings(text string) []docHeading {
	var hs []docHeading
	seen := map[string]int{}
	fence := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "```") {
			fence = !fence
			continue
		}
		// A paragraph that begins with a bold sentence is a section too
		// (cited by name, it has no anchor).
		if m := boldTitle.FindStringSubmatch(l); !fence && m != nil {
			hs = append(hs, docHeading{text: strings.ReplaceAll(m[1], "`", "")})
			continue
		}
		if fence || !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(l, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127 && r != '—' && r != '’' && r != '→':
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			seen[a]++
			a = fmt.Sprintf("%s-%d", a, n)
		} else {
			seen[a] = 1
		}
		hs = append(hs, docHeading{text: strings.ReplaceAll(h, "`", ""), anchor: a})
	}
	return hs
}

// boldTitle is a paragraph's bold first sentence.
var boldTitle = regexp.MustCompile(`^(?:- )?\*\*([^*]+?)\.?\*\*`)

// The patterns of the references checked.
var (
	reTestName  = regexp.MustCompile(`(?:\b([a-z][a-z0-9]*(?:/[a-z0-9]+)*)\.)?\b((?:Test|Fuzz|Example|Benchmark)(?:[A-Z_(][A-Za-z0-9_()]*)?)\b`)
	reQualified = regexp.MustCompile(`\b([a-z][a-z0-9]*)\.([A-Z][A-Za-z0-9_]*)(?:\.([A-Z][A-Za-z0-9_]*))?`)
	reMember    = regexp.MustCompile(`\b([A-Z][A-Za-z0-9]*)\.([A-Z][A-Za-z0-9_]*)\b`)
	reCode      = regexp.MustCompile("[`\"]([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)[`\"]")
	upperWord   = regexp.MustCompile(`\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b`)
	reLink      = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	reSection   = regexp.MustCompile(`\b((?:docs/)?[a-z-]+\.md)\)?,\s+"([^"]+)"`)
	reMigration = regexp.MustCompile(`\b[Mm]igrations?\s+(\d{1,3})\b((?:(?:\s*(?:,|and|or|/|–|to)\s*|-)\d{1,3}\b)*)`)
	reMigFile   = regexp.MustCompile(`\b(\d{3})_([a-z0-9_]+)`)
	reFlag      = regexp.MustCompile(`(?:^|[^A-Za-z0-9_-])--([a-z][a-z0-9-]*\*?)`)
	reMetric    = regexp.MustCompile(`\boutbox_[a-z0-9_]+`)
	reSQLSTATE  = regexp.MustCompile(`\bSQLSTATEs?\s+((?:[0-9A-Z]{5}(?:,\s*|\s+or\s+|\s+and\s+|/)?)+)`)
	reOutside   = regexp.MustCompile(`(?:^|[\s(\x60"'\[])((?:/work|/tmp|/home|/root|/Users)/\S*|\.\./shared\S*|file://\S*|https?://(?:www\.)?github\.com/ledgerline/\S*)`)
	reIssue     = regexp.MustCompile(`\b(?:[Ii]ssue|PR|[Pp]ull request)\s+#?\d+|(?:^|\s)#\d{2,}\b`)
	reBasename  = regexp.MustCompile(`(?:^|[^/A-Za-z0-9_.-])([A-Za-z0-9_-]+\.(?:go|sql))(?:[^A-Za-z0-9_.]|\.(?:\s|$)|$)`)
	reEnv       = regexp.MustCompile(`\bOUTBOX_[A-Z0-9_]+`)
	reMake      = regexp.MustCompile(`\bmake\s+([a-z][a-z0-9-]*)`)
	reGoPath    = regexp.MustCompile(`(?:^|[\s\x60(])\./([A-Za-z0-9_][A-Za-z0-9_/.-]*)`)
)

// docKinds are the kinds of reference, in the order the counts are shown.
var docKinds = []string{"test", "identifier", "path", "link", "section", "migration", "command", "flag", "env", "code", "make", "metric", "sqlstate", "outside"}

// subcommandWord is what a subcommand looks like (a flag, an id or a
// placeholder does not).
var subcommandWord = regexp.MustCompile(`^[a-z][a-z-]*$`)

// otherTools start a command whose flags are not outbox's.
var otherTools = map[string]bool{"go": true, "make": true, "psql": true, "pgbench": true, "pg_dump": true, "pg_restore": true,
	"curl": true, "git": true, "promtool": true, "chromium": true, "apt-get": true, "strace": true, "sha256sum": true,
	"pg_basebackup": true, "pg_ctl": true, "pgbouncer": true, "openssl": true, "vacuumdb": true}

// checkDoc returns the stale references of one document (file is its path
// relative to the root) and adds how many it checked of each kind to count.
func (ix *repoIndex) checkDoc(file, text string, count map[string]int) []docFinding {
	var out []docFinding
	// flat is the text with line ends as spaces, so that a reference
	// wrapped over two lines is found; offsets stay those of text.
	flat := strings.ReplaceAll(text, "\n", " ")
	own := markdownHeadings(text)
	lineOf := func(off int) int { return strings.Count(text[:off], "\n") + 1 }
	report := func(off int, kind, name, format string, args ...any) {
		for _, e := range docExceptions {
			if e.file == file && e.kind == kind && e.name == name {
				count["exception"]++
				usedExceptions.Store(e, true)
				return
			}
		}
		out = append(out, docFinding{file: file, line: lineOf(off), kind: kind, msg: fmt.Sprintf(format, args...)})
	}

	// (a) tests, by package when one is given.
	for _, m := range reTestName.FindAllStringSubmatchIndex(flat, -1) {
		qual, name := "", flat[m[4]:m[5]]
		if m[2] >= 0 {
			qual = flat[m[2]:m[3]]
		}
		if name == "Test" || name == "Fuzz" || name == "Example" || name == "Benchmark" {
			continue // the word, not a name
		}
		for _, n := range expandAlternatives(name) {
			count["test"]++
			if qual == "" {
				if len(ix.funcDirs[n]) == 0 {
					report(m[0], "test", n, "%s: no such function in the repository", n)
				}
				continue
			}
			dirs, ok := ix.dirsByName[qual]
			if !ok {
				report(m[0], "test", qual+"."+n, "%s.%s: no package %s in the repository", qual, n, qual)
				continue
			}
			if !slices.ContainsFunc(dirs, func(d string) bool { return ix.declsByDir[d][n] }) {
				where := "elsewhere: " + strings.Join(ix.funcDirs[n], ", ")
				if len(ix.funcDirs[n]) == 0 {
					where = "nowhere else either"
				}
				report(m[0], "test", qual+"."+n, "%s.%s: no such function in %s (%s)", qual, n, strings.Join(dirs, ", "), where)
			}
		}
	}

	// Other exported identifiers of the repository's packages:
	// pkg.Name and pkg.Type.Method (or .Field).
	for _, m := range reQualified.FindAllStringSubmatchIndex(flat, -1) {
		qual, name := flat[m[2]:m[3]], flat[m[4]:m[5]]
		dirs, ok := ix.dirsByName[qual]
		if !ok || isTestName(name) {
			continue // not the repository's, or a test (checked above)
		}
		if m[1] < len(flat) && flat[m[1]] == '/' {
			continue // a path such as test.Foo/bar is not Go
		}
		count["identifier"]++
		if !slices.ContainsFunc(dirs, func(d string) bool { return ix.declsByDir[d][name] || ix.declsByDir[d]["*."+name] }) {
			report(m[0], "identifier", qual+"."+name, "%s.%s: no such identifier in %s", qual, name, strings.Join(dirs, ", "))
			continue
		}
		if m[6] >= 0 {
			sel := name + "." + flat[m[6]:m[7]]
			count["identifier"]++
			if !slices.ContainsFunc(dirs, func(d string) bool { return ix.declsByDir[d][sel] }) {
				report(m[0], "identifier", qual+"."+sel, "%s.%s: no such method or field in %s", qual, sel, strings.Join(dirs, ", "))
			}
		}
	}

	// Type.Member without a package: some package's type has it.
	for _, m := range reMember.FindAllStringSubmatchIndex(flat, -1) {
		if m[2] > 0 && (flat[m[2]-1] == '.' || flat[m[2]-1] == '*' && m[2] > 1 && flat[m[2]-2] == '.') {
			continue // pkg.Type.Member: checked above
		}
		name := flat[m[2]:m[3]] + "." + flat[m[4]:m[5]]
		count["identifier"]++
		if !ix.members[name] {
			report(m[2], "identifier", name, "%s: no type of the repository has this method or field", name)
		}
	}

	// (b) repository paths in the text, and Go package paths of commands.
	for _, m := range ix.paths.FindAllStringSubmatchIndex(flat, -1) {
		p := strings.TrimRight(flat[m[2]:m[3]], ".,:;")
		if i := strings.LastIndexByte(p, '.'); i > 0 && isTestName(p[i+1:]) && ix.files[p[:i]] {
			continue // cmd/outbox.TestX: a test, checked above
		}
		count["path"]++
		anchor := ""
		if i := strings.IndexByte(p, '#'); i >= 0 {
			p, anchor = p[:i], p[i+1:]
		}
		ix.checkPath(p, anchor, func(format string, args ...any) { report(m[2], "path", p, format, args...) })
	}
	for _, m := range reGoPath.FindAllStringSubmatchIndex(flat, -1) {
		p := strings.TrimSuffix(strings.TrimRight(flat[m[2]:m[3]], ".,:;"), "/...")
		if p == "" || p == "." {
			continue
		}
		count["path"]++
		if !ix.files[strings.TrimSuffix(p, "/")] {
			report(m[2], "path", "./"+p, "./%s: no such file or directory in the repository", p)
		}
	}

	// Source files by name alone (record.go): somewhere in the repository.
	for _, m := range reBasename.FindAllStringSubmatchIndex(flat, -1) {
		name := flat[m[2]:m[3]]
		if reMigFile.MatchString(name) {
			continue // a migration's file: checked below
		}
		count["path"]++
		if !ix.basenames[name] {
			report(m[2], "path", name, "%s: no file of this name in the repository", name)
		}
	}

	// Links, relative to the document; anchors within the target.
	for _, m := range reLink.FindAllStringSubmatchIndex(flat, -1) {
		target := flat[m[2]:m[3]]
		count["link"]++
		if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
			report(m[2], "outside", target, "%s: a link out of the repository (the project carries its own documentation)", target)
			continue
		}
		p, anchor, _ := strings.Cut(target, "#")
		if p == "" {
			p = file
		} else {
			p = path.Clean(path.Join(path.Dir(file), p))
		}
		if p == ".." || strings.HasPrefix(p, "../") {
			report(m[2], "outside", target, "%s: a link out of the repository", target)
			continue
		}
		if p == file && anchor != "" {
			if !slices.ContainsFunc(own, func(h docHeading) bool { return h.anchor == anchor }) {
				report(m[2], "link", target, "%s has no heading with the anchor #%s", file, anchor)
			}
			continue
		}
		ix.checkPath(p, anchor, func(format string, args ...any) { report(m[2], "link", target, format, args...) })
	}

	// Sections cited by name: docs/x.md, "Heading".
	for _, m := range reSection.FindAllStringSubmatchIndex(flat, -1) {
		doc, title := flat[m[2]:m[3]], strings.Join(strings.Fields(flat[m[4]:m[5]]), " ")
		if !strings.HasPrefix(doc, "docs/") && doc != "README.md" {
			doc = path.Join("docs", doc)
		}
		count["section"]++
		hs, ok := ix.headings[doc]
		if !ok {
			report(m[2], "section", doc, "%s: no such document", doc)
			continue
		}
		if !slices.ContainsFunc(hs, func(h docHeading) bool { return strings.HasPrefix(h.text, title) }) {
			report(m[2], "section", title, "%s has no section %q", doc, title)
		}
	}

	// (c) migrations by number, and by file name.
	for _, m := range reMigration.FindAllStringSubmatchIndex(flat, -1) {
		nums := regexp.MustCompile(`\d+`).FindAllString(flat[m[2]:m[3]]+" "+flat[m[4]:m[5]], -1)
		for _, s := range nums {
			n, _ := strconv.Atoi(s)
			count["migration"]++
			if ix.migrations[n] == "" {
				report(m[0], "migration", s, "migration %s: no such migration in migrations/sql", s)
			}
		}
	}
	for _, m := range reMigFile.FindAllStringSubmatchIndex(flat, -1) {
		n, _ := strconv.Atoi(flat[m[2]:m[3]])
		name := flat[m[2]:m[5]]
		count["migration"]++
		if got, ok := ix.migrations[n]; !ok {
			report(m[0], "migration", name, "%s: no migration %03d in migrations/sql", name, n)
		} else if !strings.HasPrefix(got, name) {
			report(m[0], "migration", name, "%s: migration %03d is %s", name, n, got)
		}
	}

	// (d) flags: of the outbox command before them in the same code span
	// or command line, else of any command.
	for _, seg := range codeSegments(text) {
		current := ""
		toks := strings.Fields(seg.text)
		for i, tok := range toks {
			tok = strings.Trim(tok, "`'\"(")
			switch {
			case tok == "outbox" && i+1 < len(toks) && ix.flags[strings.Trim(toks[i+1], "`'\",.;:)")] != nil:
				current = strings.Trim(toks[i+1], "`'\",.;:)")
				count["command"]++
				// The word after the command, when it is one, is a
				// subcommand its usage names.
				if i+2 < len(toks) {
					sub := strings.Trim(toks[i+2], "`'\",.;:)")
					if subcommandWord.MatchString(sub) && current != "bench" && !strings.Contains(ix.usages[current], sub) {
						report(seg.off, "command", "outbox "+current+" "+sub, "outbox %s %s: its usage names no %s (%s)", current, sub, sub, ix.usages[current])
					}
				}
			case tok == "outbox" && i+1 < len(toks) && subcommandWord.MatchString(toks[i+1]) && toks[i+1] == strings.Trim(toks[i+1], "`'\",.;:)"):
				count["command"]++
				if toks[i+1] != "help" {
					report(seg.off, "command", "outbox "+toks[i+1], "outbox %s: no such command", toks[i+1])
				}
			case tok == "|" || tok == "&&" || tok == ";" || tok == "||":
				current = ""
			case i == 0 && otherTools[tok] || i > 0 && (toks[i-1] == "|" || toks[i-1] == "&&" || toks[i-1] == "$") && otherTools[tok]:
				current = "-" // another tool's flags follow
			}
			fm := reFlag.FindStringSubmatch(" " + tok)
			if fm == nil || current == "-" {
				continue
			}
			name := fm[1]
			count["flag"]++
			if strings.HasSuffix(name, "*") {
				if !ix.anyFlagWithPrefix(strings.TrimSuffix(name, "*"), current) {
					report(seg.off, "flag", "--"+name, "--%s: no such flag%s", name, ofCommand(current))
				}
				continue
			}
			if current != "" && !ix.flags[current][name] {
				report(seg.off, "flag", "--"+name, "--%s: no such flag%s", name, ofCommand(current))
			} else if current == "" && !ix.allFlags[name] {
				report(seg.off, "flag", "--"+name, "--%s: no outbox command has this flag", name)
			}
		}
	}
	// Flags in prose (outside code) are any command's.
	for _, m := range reFlag.FindAllStringSubmatchIndex(proseOnly(text), -1) {
		name := flat[m[2]:m[3]]
		count["flag"]++
		if strings.HasSuffix(name, "*") && ix.anyFlagWithPrefix(strings.TrimSuffix(name, "*"), "") || ix.allFlags[name] {
			continue
		}
		report(m[2], "flag", "--"+name, "--%s: no outbox command has this flag", name)
	}

	// Error codes, states and other UPPER_CASE names quoted: the program
	// says them (in Go, SQL or the console's assets), not only its tests.
	for _, m := range reCode.FindAllStringSubmatchIndex(flat, -1) {
		name := flat[m[2]:m[3]]
		if strings.HasPrefix(name, "OUTBOX_") {
			continue // a variable: checked below
		}
		count["code"]++
		if !ix.codes[name] {
			report(m[2], "code", name, "%s: the program's sources never say it", name)
		}
	}

	// OUTBOX_* variables: a flag's, or one the code or the Makefile reads.
	for _, m := range reEnv.FindAllStringIndex(flat, -1) {
		name := flat[m[0]:m[1]]
		count["env"]++
		if !ix.envVars[name] {
			report(m[0], "env", name, "%s: no flag has this variable, and neither the code nor the Makefile reads it", name)
		}
	}
	// make targets, in code.
	for _, seg := range codeSegments(text) {
		for _, m := range reMake.FindAllStringSubmatch(seg.text, -1) {
			count["make"]++
			if !ix.makeTarget[m[1]] {
				report(seg.off, "make", m[1], "make %s: no such target in the Makefile", m[1])
			}
		}
	}

	// (e) metrics.
	for _, m := range reMetric.FindAllStringIndex(flat, -1) {
		name := flat[m[0]:m[1]]
		if ix.notMetrics[name] || m[0] > 0 && flat[m[0]-1] == '.' {
			continue
		}
		count["metric"]++
		if !ix.metrics[name] {
			report(m[0], "metric", name, "%s: no relay service exports this metric", name)
		}
	}

	// SQLSTATEs the code or the migrations name.
	for _, m := range reSQLSTATE.FindAllStringSubmatchIndex(flat, -1) {
		for _, code := range regexp.MustCompile(`[0-9A-Z]{5}`).FindAllString(flat[m[2]:m[3]], -1) {
			count["sqlstate"]++
			if !ix.sqlstates[code] {
				report(m[0], "sqlstate", code, "SQLSTATE %s: neither the code nor the migrations name it", code)
			}
		}
	}

	// (f) nothing outside the repository.
	for _, m := range reOutside.FindAllStringSubmatchIndex(flat, -1) {
		count["outside"]++
		name := strings.TrimRight(flat[m[2]:m[3]], "`'\".,;:)")
		if m[2] >= 2 && flat[m[2]-2:m[2]] == "](" {
			continue // a link's target: reported with the links
		}
		report(m[2], "outside", name, "%s points outside the repository", name)
	}
	for _, m := range reIssue.FindAllStringIndex(flat, -1) {
		count["outside"]++
		name := strings.TrimSpace(flat[m[0]:m[1]])
		report(m[0], "outside", name, "%q points outside the repository (an issue tracker)", name)
	}
	return out
}

func isTestName(s string) bool {
	for _, p := range []string{"Test", "Fuzz", "Example", "Benchmark"} {
		if strings.HasPrefix(s, p) && (len(s) == len(p) || s[len(p)] >= 'A' && s[len(p)] <= 'Z' || s[len(p)] == '_' || s[len(p)] == '(') {
			return true
		}
	}
	return false
}

func ofCommand(c string) string {
	if c == "" {
		return ""
	}
	return " of outbox " + c
}

func (ix *repoIndex) anyFlagWithPrefix(prefix, command string) bool {
	set := ix.allFlags
	if command != "" {
		set = ix.flags[command]
	}
	for f := range set {
		if strings.HasPrefix(f, prefix) {
			return true
		}
	}
	return false
}

// pathPattern matches a repository path: one of the root's own entries,
// then anything a path holds.
func (ix *repoIndex) pathPattern() *regexp.Regexp {
	dirs := map[string]bool{}
	for f := range ix.files {
		if top, _, ok := strings.Cut(f, "/"); ok {
			dirs[top] = true
		}
	}
	var tops []string
	for f := range ix.files {
		switch {
		case strings.Contains(f, "/") || strings.HasPrefix(f, "."):
		case dirs[f]:
			tops = append(tops, regexp.QuoteMeta(f)+"/")
		default:
			tops = append(tops, regexp.QuoteMeta(f)+`\b`)
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(tops)))
	return regexp.MustCompile(`(?:^|[\s(\x60"'\[])((?:` + strings.Join(tops, "|") + `)[A-Za-z0-9_./*#-]*)`)
}

// checkPath reports a path (a glob allowed) that does not exist, or an
// anchor its document does not have.
func (ix *repoIndex) checkPath(p, anchor string, report func(format string, args ...any)) {
	p = strings.TrimSuffix(p, "/")
	if strings.ContainsAny(p, "*") {
		if ms, _ := filepath.Glob(filepath.Join(repoRoot, filepath.FromSlash(p))); len(ms) == 0 {
			report("%s: matches nothing in the repository", p)
		}
		return
	}
	if !ix.files[p] {
		report("%s: no such file or directory in the repository", p)
		return
	}
	if anchor == "" {
		return
	}
	if !slices.ContainsFunc(ix.headings[p], func(h docHeading) bool { return h.anchor == anchor }) {
		report("%s has no heading with the anchor #%s", p, anchor)
	}
}

// codeSegment is a code span or a line of a code block (lines continued
// with a backslash joined), with its offset in the document.
type codeSegment struct {
	off  int
	text string
}

// codeSegments returns a document's code spans and code block lines.
func codeSegments(text string) []codeSegment {
	var segs []codeSegment
	off, fence := 0, false
	var prose strings.Builder
	proseStart := 0
	flushProse := func() {
		s := prose.String()
		for i := 0; i < len(s); {
			a := strings.IndexByte(s[i:], '`')
			if a < 0 {
				break
			}
			b := strings.IndexByte(s[i+a+1:], '`')
			if b < 0 {
				break
			}
			segs = append(segs, codeSegment{off: proseStart + i + a + 1, text: s[i+a+1 : i+a+1+b]})
			i += a + b + 2
		}
		prose.Reset()
	}
	var cont *codeSegment
	for _, l := range strings.SplitAfter(text, "\n") {
		if strings.HasPrefix(l, "```") {
			if !fence {
				flushProse()
			}
			fence = !fence
			off += len(l)
			proseStart = off
			continue
		}
		if fence {
			line := strings.TrimRight(l, "\n")
			if cont != nil {
				cont.text += " " + line
			} else {
				segs = append(segs, codeSegment{off: off, text: line})
				cont = &segs[len(segs)-1]
			}
			if strings.HasSuffix(strings.TrimSpace(line), "\\") {
				cont.text = strings.TrimSuffix(strings.TrimSpace(cont.text), "\\")
			} else {
				cont = nil
			}
		} else {
			if prose.Len() == 0 {
				proseStart = off
			}
			prose.WriteString(strings.ReplaceAll(l, "\n", " "))
		}
		off += len(l)
	}
	flushProse()
	return segs
}

// proseOnly blanks a document's code spans and code blocks (keeping every
// offset), leaving the flags named in running text.
func proseOnly(text string) string {
	b := []byte(strings.ReplaceAll(text, "\n", " "))
	for _, s := range codeSegments(text) {
		for i := s.off; i < s.off+len(s.text) && i < len(b); i++ {
			b[i] = ' '
		}
	}
	// Code block lines joined by a backslash are longer than the span
	// they came from: blank whole fenced blocks as well.
	fence := false
	off := 0
	for _, l := range strings.SplitAfter(text, "\n") {
		if strings.HasPrefix(l, "```") || fence {
			for i := off; i < off+len(l); i++ {
				b[i] = ' '
			}
		}
		if strings.HasPrefix(l, "```") {
			fence = !fence
		}
		off += len(l)
	}
	return string(b)
}

// expandAlternatives spells out a name with optional parts in
// parentheses: Test(Bound)Tenant is TestTenant and TestBoundTenant.
func expandAlternatives(name string) []string {
	i := strings.IndexByte(name, '(')
	j := strings.IndexByte(name, ')')
	if i < 0 || j < i {
		return []string{strings.Trim(name, "()")}
	}
	var out []string
	for _, rest := range expandAlternatives(name[j+1:]) {
		out = append(out, name[:i]+rest, name[:i]+name[i+1:j]+rest)
	}
	return out
}

// theDocs are the documents checked: README.md and docs/*.md.
func theDocs(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"README.md"}
	for _, d := range docs {
		rel, err := filepath.Rel(repoRoot, d)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, filepath.ToSlash(rel))
	}
	return out
}

// TestDocsReferencesExist: every test, identifier, path, link, section,
// migration, command, flag, variable, make target, metric and SQLSTATE
// that README.md, docs/*.md, the package doc comments, the commands'
// --help, the messages citing a document and the alert rules name exists,
// and nothing they name is outside the repository.
func TestDocsReferencesExist(t *testing.T) {
	t.Parallel()
	ix, err := loadRepoIndex()
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, d := range theDocs(t) {
		text, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(d)))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range ix.checkDoc(d, string(text), count) {
			t.Error(f)
		}
	}
	// The package doc comments, every command's --help, the messages that
	// cite a document and the alert rules' runbook lines are checked alike
	// (a help text's lines are its output's).
	rules, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "prometheus", "outbox-rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, docs := range []map[string]string{ix.pkgDocs, ix.helps, ix.docCites, {"deploy/prometheus/outbox-rules.yml": string(rules)}} {
		for _, name := range slices.Sorted(maps.Keys(docs)) {
			for _, f := range ix.checkDoc(name, docs[name], count) {
				t.Error(f)
			}
		}
	}
	var counts []string
	for _, k := range append(docKinds, "exception") {
		counts = append(counts, fmt.Sprintf("%s %d", k, count[k]))
	}
	t.Logf("references checked: %s", strings.Join(counts, ", "))
	for _, e := range docExceptions {
		t.Logf("not checked: %s %s in %s: %s", e.kind, e.name, e.file, e.why)
	}
	for _, e := range docExceptions {
		if _, ok := usedExceptions.Load(e); !ok {
			t.Errorf("docExceptions: %s %s in %s is in no document any more: remove it", e.kind, e.name, e.file)
		}
	}
}

// TestDocsCheckerFindsStale: each kind of stale reference, put in a
// document, is reported at its line; the live ones beside them are not.
func TestDocsCheckerFindsStale(t *testing.T) {
	t.Parallel()
	ix, err := loadRepoIndex()
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.Join([]string{
		"# A document", // 1
		"Live: `store.TestTamperingIsReported`, `TestHelp`, `poolconfig.Test(Bound)TenantBehindATransactionPooler`, `pending.ErrReadOnly`,", // 2
		"`store.Store.LostClaims`, `internal/store/claim.go`, [ops](operations.md#upgrading), [here](#a-document),",                         // 3
		"(docs/operations.md, \"Upgrading\"), migrations 049 and 050, `outbox relay --admin-addr`, `--lock-try`,",                           // 4
		"`outbox_claimed_total`, `outbox_relayer`, SQLSTATE 55P03, `go test ./cmd/outbox -run X`.",                                          // 5
		"Stale: `store.TestNoSuchThing`",                                  // 6
		"`TestNoSuchThingAnywhere`",                                       // 7
		"`engine.TestDocsReferencesExist` (it is main's)",                 // 8
		"`pending.ErrNoSuchError` and `relay.Config.NoSuchField`",         // 9
		"`internal/store/nosuch.go` and `migrations/sql/099_*.sql`",       // 10
		"[gone](operations.md#no-such-anchor) and [away](nosuch.md)",      // 11
		"(docs/operations.md, \"No such section\")",                       // 12
		"migration 099, `099_nothing.sql`, `049_wrong_name.sql`",          // 13
		"`outbox relay --no-such-flag` and `outbox migrate --admin-addr`", // 14
		"`--nowhere-flag`",              // 15
		"`outbox_no_such_metric_total`", // 16
		"SQLSTATE 99X99",                // 17
		"`/work/main/README.md` and [shared](../../shared/notes.md) and ../shared", // 18
		"```sh",                // 19
		"outbox dlq list \\",   // 20
		"  --no-such-dlq-flag", // 21
		"```",                  // 22
		"`./no/such/pkg`",      // 23
		"`OUTBOX_NO_SUCH_VARIABLE`, but `OUTBOX_LOCK_TRY` and `OUTBOX_TEST_DATABASE_URL`", // 24
		"`make nosuch`, but `make demo`",                                                         // 25
		"`outbox frobnicate`, but `outbox help` and `outbox dlq replay ID`",                      // 26
		"`outbox dlq frob`",                                                                      // 27
		"`nosuch_file.go`, but `record.go`",                                                      // 28
		"Issue #123 and [the tracker](https://github.com/ledgerline/outbox/issues/1)",            // 29
		"`Settings.NoSuchMethod`, but `Settings.Validate` and `relay.Config.HealBound`",          // 30
		"`\"error\": \"NO_SUCH_CODE\"`, but `\"error\": \"COMMIT_UNKNOWN\"` and `RAIL_REJECTED`", // 31
	}, "\n") + "\n"
	want := map[int][]string{
		6: {"test"}, 7: {"test"}, 8: {"test"}, 9: {"identifier", "identifier"}, 10: {"path", "path"},
		11: {"link", "link"}, 12: {"section"}, 13: {"migration", "migration", "migration"},
		14: {"flag", "flag"}, 15: {"flag"}, 16: {"metric"}, 17: {"sqlstate"}, 18: {"outside", "outside", "outside"},
		20: {"flag"}, 23: {"path"}, 24: {"env"}, 25: {"make"}, 26: {"command"}, 27: {"command"}, 28: {"path"},
		29: {"outside", "outside"}, 30: {"identifier"}, 31: {"code"},
	}
	got := map[int][]string{}
	for _, f := range ix.checkDoc("docs/checker.md", doc, map[string]int{}) {
		got[f.line] = append(got[f.line], f.kind)
		t.Log(f)
	}
	for _, m := range []map[int][]string{want, got} {
		for _, kinds := range m {
			sort.Strings(kinds)
		}
	}
	for line := 1; line <= 31; line++ {
		if !slices.Equal(got[line], want[line]) {
			t.Errorf("line %d: found %v, want %v", line, got[line], want[line])
		}
	}
}
