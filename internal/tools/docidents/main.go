// Command docidents checks that the Go identifiers the documentation names
// in backticks exist in this module.
//
// It reads README.md, docs/*.md, samples/*/README.md and
// examples/*/README.md (CHANGELOG.md is history and is not read) and looks at
// every inline code span outside fenced code blocks (those are checked by
// internal/tools/docsnippets). A span is checked when, after removing call
// arguments, type arguments, composite literal braces and a leading `*`, `&`
// or `[]`, it is a qualified identifier whose first element is the name of a
// package of this module and whose second element starts with an upper-case
// letter:
//
//	`bus.New`, `bus.New(ctx, opts...)`, `endpoint.Context[T]`,
//	`(*bus.Bus).Stop`, `outbox.Options.InboxLockTimeout`,
//	`transport/inproc.Config`
//
// The second element must be a top-level func, type, var or const of that
// package (of any of them when packages share a name); a third or later
// element must be a field or method of the type reached so far, pointer
// receivers, interface methods and promoted fields and methods included.
// Where the type cannot be followed within this module (an embedded type
// from another module, a var set from another module's function, a type
// parameter, a field of an unnamed or generic-argument type) the rest of the
// span is accepted rather than reported. Packages named main and _test.go
// files are not read; files of every build tag are.
//
// Everything else is ignored: unqualified names, receiver variables such as
// `b.Stop`, names from other modules such as `time.Second`, file names such
// as `bus.go`, commands, SQL and header names. A deliberate mention of
// something that does not exist is allowed with the comment
//
//	<!-- docidents: ignore -->
//
// on the same line (it covers every span of that line) or alone on the line
// before. Keep it rare: a page saying what a name used to be is the case it
// is for.
//
// Each miss is printed as "file:line: `span`: reason" and the exit status is 1;
// without misses the command prints nothing (with -v it prints a count).
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

func main() {
	verbose := flag.Bool("v", false, "print how many identifiers were checked")
	root := flag.String("root", "", "module root (default: the directory holding the nearest go.mod)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: docidents [-v] [-root dir]\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	dir := *root
	if dir == "" {
		var err error
		if dir, err = findRoot(); err != nil {
			fmt.Fprintln(os.Stderr, "docidents:", err)
			os.Exit(2)
		}
	}
	os.Exit(run(dir, *verbose, os.Stdout, os.Stderr))
}

// findRoot returns the nearest directory at or above the working directory
// that holds a go.mod.
func findRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod found at or above the working directory")
		}
		dir = parent
	}
}

// docPatterns are the Markdown files read, relative to the module root.
var docPatterns = []string{"README.md", "docs/*.md", "samples/*/README.md", "examples/*/README.md"}

// run checks the documentation under root and returns the exit status:
// 0 without misses, 1 with misses, 2 when the module cannot be read.
func run(root string, verbose bool, stdout, stderr io.Writer) int {
	mod, err := loadModule(root)
	if err != nil {
		fmt.Fprintln(stderr, "docidents:", err)
		return 2
	}
	var files []string
	for _, pattern := range docPatterns {
		m, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			fmt.Fprintln(stderr, "docidents:", err)
			return 2
		}
		files = append(files, m...)
	}
	var st stats
	misses := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintln(stderr, "docidents:", err)
			return 2
		}
		name := f
		if rel, err := filepath.Rel(root, f); err == nil {
			name = filepath.ToSlash(rel)
		}
		for _, m := range checkDoc(mod, name, string(data), &st) {
			fmt.Fprintln(stderr, m)
			misses++
		}
	}
	if verbose {
		fmt.Fprintf(stdout, "docidents: %d identifier(s) checked in %d file(s) against %d package(s); %d miss(es), %d ignored by comment\n",
			st.checked, len(files), len(mod.pkgs), misses, st.ignored)
	}
	if misses > 0 {
		return 1
	}
	return 0
}

type stats struct {
	checked int // spans naming a package of the module
	ignored int // such spans skipped by a docidents: ignore comment
}

// ---------------------------------------------------------------------------
// Markdown

// span is an inline code span and the 1-based line it starts on.
type span struct {
	text string
	line int
}

var ignoreComment = regexp.MustCompile(`<!--\s*docidents:\s*ignore\s*-->`)

// checkDoc returns the misses of one Markdown file, named name in messages.
func checkDoc(mod *module, name, text string, st *stats) []string {
	lines := strings.Split(text, "\n")
	// A comment covers its own line and, when it stands alone, the next.
	ignored := make([]bool, len(lines)+2) // by 1-based line
	for i, l := range lines {
		if ignoreComment.MatchString(l) {
			ignored[i+1] = true
			if strings.TrimSpace(ignoreComment.ReplaceAllString(l, "")) == "" {
				ignored[i+2] = true
			}
		}
	}
	var misses []string
	for _, sp := range codeSpans(lines) {
		ref, ok := mod.parseRef(sp.text)
		if !ok {
			continue
		}
		if ignored[sp.line] {
			st.ignored++
			continue
		}
		st.checked++
		if msg := mod.check(ref); msg != "" {
			misses = append(misses, fmt.Sprintf("%s:%d: `%s`: %s", name, sp.line, sp.text, msg))
		}
	}
	return misses
}

// codeSpans returns the inline code spans of a Markdown document, skipping
// fenced code blocks. Spans may continue over the lines of one paragraph.
func codeSpans(lines []string) []span {
	var spans []span
	var para []string // lines of the current paragraph
	start := 0        // 1-based line of para[0]
	flush := func() {
		if len(para) > 0 {
			spans = append(spans, paragraphSpans(para, start)...)
		}
		para = nil
	}
	fence := "" // the opening fence while inside a fenced block
	for i, l := range lines {
		t := strings.TrimSpace(l)
		if fence != "" {
			if strings.HasPrefix(t, fence) && strings.Trim(t, fence[:1]) == "" {
				fence = ""
			}
			continue
		}
		if f := openingFence(t); f != "" {
			flush()
			fence = f
			continue
		}
		if t == "" {
			flush()
			continue
		}
		if startsBlock(t) {
			flush()
		}
		if len(para) == 0 {
			start = i + 1
		}
		para = append(para, l)
		if t[0] == '#' || t[0] == '|' {
			flush() // a heading or table row is a block of one line
		}
	}
	flush()
	return spans
}

// listMarker matches the start of a list item.
var listMarker = regexp.MustCompile(`^(?:[-*+]|\d{1,9}[.)])(?:\s|$)`)

// startsBlock reports whether a trimmed line begins a new Markdown block, so
// that a code span cannot continue into it from the lines before.
func startsBlock(t string) bool {
	return t[0] == '#' || t[0] == '|' || t[0] == '>' || strings.HasPrefix(t, "<!--") || listMarker.MatchString(t)
}

// openingFence returns the fence (``` or ~~~, three or more) a trimmed line
// opens, or "".
func openingFence(t string) string {
	for _, c := range []byte{'`', '~'} {
		n := 0
		for n < len(t) && t[n] == c {
			n++
		}
		if n >= 3 {
			if c == '`' && strings.ContainsRune(t[n:], '`') {
				return "" // an inline span such as ```x```, not a fence
			}
			return t[:n]
		}
	}
	return ""
}

// paragraphSpans finds the code spans of one paragraph whose first line is
// the 1-based line first, following CommonMark: a run of n backticks opens a
// span that the next run of exactly n backticks closes; line endings inside
// become spaces and one space on both sides is removed.
func paragraphSpans(para []string, first int) []span {
	s := strings.Join(para, "\n")
	lineAt := func(off int) int { return first + strings.Count(s[:off], "\n") }
	var spans []span
	for i := 0; i < len(s); {
		switch s[i] {
		case '\\':
			i += 2 // an escaped character cannot open a span
			continue
		case '`':
		default:
			i++
			continue
		}
		n := runLen(s, i)
		end := -1
		for j := i + n; j < len(s); {
			if s[j] != '`' {
				j++
				continue
			}
			m := runLen(s, j)
			if m == n {
				end = j
				break
			}
			j += m
		}
		if end < 0 {
			i += n // an unmatched run is literal text
			continue
		}
		body := strings.ReplaceAll(s[i+n:end], "\n", " ")
		if len(body) >= 2 && body[0] == ' ' && body[len(body)-1] == ' ' && strings.Trim(body, " ") != "" {
			body = body[1 : len(body)-1]
		}
		spans = append(spans, span{text: body, line: lineAt(i)})
		i = end + n
	}
	return spans
}

func runLen(s string, i int) int {
	n := 0
	for i+n < len(s) && s[i+n] == '`' {
		n++
	}
	return n
}

// ---------------------------------------------------------------------------
// Spans to references

// ref is a checked span: the packages its first element names and the
// remaining elements.
type ref struct {
	pkgs  []*pkg
	names []string // names[0] is the package-level name
}

var (
	// methodExpr matches `(*T).M` and `(T).M`.
	methodExpr = regexp.MustCompile(`^\(\s*\*?\s*([^()\s]+)\s*\)(.*)$`)
	// qualified matches an optional import path prefix and a dotted
	// identifier chain of at least two elements.
	qualified = regexp.MustCompile(`^((?:[A-Za-z0-9_.~-]+/)*)([\pL_][\pL\pN_]*(?:\.[\pL_][\pL\pN_]*)+)$`)
)

// parseRef reports whether a span names something in a package of this
// module and, if so, what.
func (m *module) parseRef(text string) (ref, bool) {
	s := normalize(text)
	g := qualified.FindStringSubmatch(s)
	if g == nil {
		return ref{}, false
	}
	prefix, elems := g[1], strings.Split(g[2], ".")
	if r, _ := utf8.DecodeRuneInString(elems[1]); !unicode.IsUpper(r) {
		return ref{}, false // `bus.go`, `outbox.sql`: not an exported name
	}
	var pkgs []*pkg
	if prefix == "" {
		pkgs = m.byName[elems[0]]
	} else {
		path := prefix + elems[0]
		p := m.byPath[path]
		if p == nil {
			p = m.byPath[m.path+"/"+path]
		}
		if p != nil {
			pkgs = []*pkg{p}
		}
	}
	if len(pkgs) == 0 {
		return ref{}, false
	}
	return ref{pkgs: pkgs, names: elems[1:]}, true
}

// normalize removes from a span what is not part of the name it refers to:
// surrounding spaces, a leading `*`, `&`, `[]` or `...`, the parentheses of
// a method expression, and call arguments, type arguments and composite
// literal braces anywhere.
func normalize(s string) string {
	s = strings.TrimSpace(s)
	for {
		t := strings.TrimLeft(s, "*&")
		t = strings.TrimPrefix(t, "[]")
		t = strings.TrimPrefix(t, "...")
		if t == s {
			break
		}
		s = t
	}
	if g := methodExpr.FindStringSubmatch(s); g != nil {
		s = g[1] + g[2]
	}
	var b strings.Builder
	depth := 0
	for _, r := range s {
		switch r {
		case '(', '[', '{':
			depth++
		case ')', ']', '}':
			if depth == 0 {
				return s // unbalanced: leave it to fail the pattern
			}
			depth--
		default:
			if depth == 0 {
				b.WriteRune(r)
			}
		}
	}
	if depth != 0 {
		return s
	}
	return b.String()
}

// ---------------------------------------------------------------------------
// The module's packages

type module struct {
	path   string // module path from go.mod
	pkgs   []*pkg
	byName map[string][]*pkg
	byPath map[string]*pkg
}

// pkg is the declarations of one package, from its non-test files of every
// build configuration.
type pkg struct {
	name, path string
	types      map[string]decl
	funcs      map[string]decl            // decl.expr is the *ast.FuncType
	values     map[string]decl            // vars and consts; decl.expr is the type or nil
	methods    map[string]map[string]decl // receiver type name -> method -> *ast.FuncType
}

// decl is a declaration's type expression and the file it appears in, for
// resolving the file's imports.
type decl struct {
	expr ast.Expr
	file *ast.File
}

// loadModule parses every package of the module rooted at root, except
// main packages, test files, testdata, and nested modules.
func loadModule(root string) (*module, error) {
	modPath, err := modulePath(filepath.Join(root, "go.mod"))
	if err != nil {
		return nil, err
	}
	m := &module{path: modPath, byName: map[string][]*pkg{}, byPath: map[string]*pkg{}}
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if path != root {
			base := d.Name()
			if strings.HasPrefix(base, ".") || strings.HasPrefix(base, "_") || base == "testdata" || base == "vendor" {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir
			}
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		importPath := modPath
		if rel != "." {
			importPath += "/" + filepath.ToSlash(rel)
		}
		return m.loadDir(fset, path, importPath)
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(m.pkgs, func(i, j int) bool { return m.pkgs[i].path < m.pkgs[j].path })
	for _, p := range m.pkgs {
		m.byName[p.name] = append(m.byName[p.name], p)
		m.byPath[p.path] = p
	}
	return m, nil
}

func modulePath(gomod string) (string, error) {
	f, err := os.Open(gomod)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "module" {
			return strings.Trim(fields[1], `"`), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%s: no module line", gomod)
}

// loadDir adds the package in dir, if any. Files of another package name
// (a `//go:build ignore` program, say) are left out.
func (m *module) loadDir(fset *token.FileSet, dir, importPath string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var files []*ast.File
	counts := map[string]int{}
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") ||
			strings.HasPrefix(n, ".") || strings.HasPrefix(n, "_") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files = append(files, f)
		counts[f.Name.Name]++
	}
	name, best := "", 0
	for n, c := range counts {
		if c > best || (c == best && n < name) {
			name, best = n, c
		}
	}
	if name == "" || name == "main" {
		return nil
	}
	p := &pkg{
		name:    name,
		path:    importPath,
		types:   map[string]decl{},
		funcs:   map[string]decl{},
		values:  map[string]decl{},
		methods: map[string]map[string]decl{},
	}
	for _, f := range files {
		if f.Name.Name == name {
			p.add(f)
		}
	}
	m.pkgs = append(m.pkgs, p)
	return nil
}

// add records the top-level declarations and methods of one file.
func (p *pkg) add(f *ast.File) {
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil || len(d.Recv.List) == 0 {
				p.funcs[d.Name.Name] = decl{d.Type, f}
				continue
			}
			if id, ok := baseType(d.Recv.List[0].Type).(*ast.Ident); ok {
				if p.methods[id.Name] == nil {
					p.methods[id.Name] = map[string]decl{}
				}
				p.methods[id.Name][d.Name.Name] = decl{d.Type, f}
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					p.types[s.Name.Name] = decl{s.Type, f}
				case *ast.ValueSpec:
					for i, n := range s.Names {
						p.values[n.Name] = decl{valueType(s, i), f}
					}
				}
			}
		}
	}
}

// valueType returns the type expression of the i-th name of a var or const
// spec when it is written or evident from the value (T{...}, &T{...},
// T(x)); nil otherwise.
func valueType(s *ast.ValueSpec, i int) ast.Expr {
	if s.Type != nil {
		return s.Type
	}
	if len(s.Values) != len(s.Names) {
		return nil
	}
	v := s.Values[i]
	if u, ok := v.(*ast.UnaryExpr); ok && u.Op == token.AND {
		v = u.X
	}
	switch v := v.(type) {
	case *ast.CompositeLit:
		return v.Type
	case *ast.CallExpr:
		return &callResult{v.Fun}
	}
	return nil
}

// callResult stands for the type of a call: the result of a function, or
// the type of a conversion.
type callResult struct {
	ast.Expr // the called expression
}

// baseType strips pointers, parentheses and type arguments from a type
// expression.
func baseType(e ast.Expr) ast.Expr {
	for {
		switch t := e.(type) {
		case *ast.StarExpr:
			e = t.X
		case *ast.ParenExpr:
			e = t.X
		case *ast.IndexExpr:
			e = t.X
		case *ast.IndexListExpr:
			e = t.X
		default:
			return e
		}
	}
}

// ---------------------------------------------------------------------------
// Resolution

// typeRef is a named type of the module.
type typeRef struct {
	p    *pkg
	name string
}

// importedPkg returns the module package that the name x refers to in file
// f, or nil when x is not an import of a module package.
func (m *module) importedPkg(f *ast.File, x string) *pkg {
	for _, imp := range f.Imports {
		path := strings.Trim(imp.Path.Value, "`\"")
		q := m.byPath[path]
		if q == nil {
			continue
		}
		local := q.name
		if imp.Name != nil {
			local = imp.Name.Name
		}
		if local == x {
			return q
		}
	}
	return nil
}

// resolve returns the named module type that the type expression e in
// package p, file f denotes, or nil when it cannot be followed.
func (m *module) resolve(p *pkg, f *ast.File, e ast.Expr) *typeRef {
	if c, ok := e.(*callResult); ok {
		return m.resolveCall(p, f, c.Expr)
	}
	switch t := baseType(e).(type) {
	case *ast.Ident:
		if _, ok := p.types[t.Name]; ok {
			return &typeRef{p, t.Name}
		}
	case *ast.SelectorExpr:
		if x, ok := t.X.(*ast.Ident); ok {
			if q := m.importedPkg(f, x.Name); q != nil {
				if _, ok := q.types[t.Sel.Name]; ok {
					return &typeRef{q, t.Sel.Name}
				}
			}
		}
	}
	return nil
}

// resolveCall returns the type of a call of fun: a conversion to a module
// type, or the first result of a module function.
func (m *module) resolveCall(p *pkg, f *ast.File, fun ast.Expr) *typeRef {
	fun = baseType(fun)
	q, name := p, ""
	switch t := fun.(type) {
	case *ast.Ident:
		name = t.Name
	case *ast.SelectorExpr:
		x, ok := t.X.(*ast.Ident)
		if !ok {
			return nil
		}
		if q = m.importedPkg(f, x.Name); q == nil {
			return nil
		}
		name = t.Sel.Name
	default:
		return nil
	}
	if _, ok := q.types[name]; ok {
		return &typeRef{q, name}
	}
	if d, ok := q.funcs[name]; ok {
		return m.firstResult(q, d)
	}
	return nil
}

// firstResult returns the named module type of a function's first result.
func (m *module) firstResult(p *pkg, d decl) *typeRef {
	ft, ok := d.expr.(*ast.FuncType)
	if !ok || ft.Results == nil || len(ft.Results.List) == 0 {
		return nil
	}
	return m.resolve(p, d.file, ft.Results.List[0].Type)
}

// lookup is the result of looking a name up.
type lookup int

const (
	missing lookup = iota
	found          // next, if not nil, is the type to follow
	unknown        // the type could not be followed: accept
)

// topLevel looks up a package-level name and returns the type to follow
// for a further element.
func (m *module) topLevel(p *pkg, name string) (lookup, *typeRef) {
	if _, ok := p.types[name]; ok {
		return found, &typeRef{p, name}
	}
	if d, ok := p.funcs[name]; ok {
		return found, m.firstResult(p, d)
	}
	if d, ok := p.values[name]; ok {
		if d.expr == nil {
			return found, nil
		}
		return found, m.resolve(p, d.file, d.expr)
	}
	return missing, nil
}

// member looks up a field or method of a named type, promoted ones
// included.
func (m *module) member(t typeRef, name string, seen map[typeRef]bool) (lookup, *typeRef) {
	if seen[t] {
		return missing, nil
	}
	seen[t] = true
	d, ok := t.p.types[t.name]
	if !ok {
		return unknown, nil
	}
	if md, ok := t.p.methods[t.name][name]; ok {
		return found, m.firstResult(t.p, md)
	}
	result := missing
	// follow looks name up in an embedded, aliased or underlying type.
	follow := func(e ast.Expr) (lookup, *typeRef) {
		r := m.resolve(t.p, d.file, e)
		if r == nil {
			return unknown, nil
		}
		return m.member(*r, name, seen)
	}
	switch tt := d.expr.(type) {
	case *ast.StructType:
		for _, fld := range tt.Fields.List {
			for _, n := range fld.Names {
				if n.Name == name {
					return found, m.resolve(t.p, d.file, fld.Type)
				}
			}
		}
		for _, fld := range tt.Fields.List {
			if len(fld.Names) > 0 {
				continue
			}
			if embeddedName(fld.Type) == name {
				return found, m.resolve(t.p, d.file, fld.Type)
			}
			switch l, next := follow(fld.Type); l {
			case found:
				return found, next
			case unknown:
				result = unknown
			}
		}
	case *ast.InterfaceType:
		for _, meth := range tt.Methods.List {
			if len(meth.Names) == 0 {
				switch baseType(meth.Type).(type) {
				case *ast.Ident, *ast.SelectorExpr:
				default:
					continue // a union or ~T term in a constraint
				}
				switch l, next := follow(meth.Type); l {
				case found:
					return found, next
				case unknown:
					result = unknown
				}
				continue
			}
			for _, n := range meth.Names {
				if n.Name == name {
					return found, m.firstResult(t.p, decl{meth.Type, d.file})
				}
			}
		}
	case *ast.Ident, *ast.SelectorExpr, *ast.StarExpr, *ast.IndexExpr, *ast.IndexListExpr, *ast.ParenExpr:
		// An alias or a type defined from another named type: its
		// fields (and, for an alias or interface, its methods).
		return follow(tt)
	}
	return result, nil
}

// embeddedName returns the field name of an embedded field's type.
func embeddedName(e ast.Expr) string {
	switch t := baseType(e).(type) {
	case *ast.Ident:
		return t.Name
	case *ast.SelectorExpr:
		return t.Sel.Name
	}
	return ""
}

// check returns why a reference does not exist, or "" when it does. With
// several packages of the same name, one having it is enough; otherwise the
// package where the lookup went furthest is reported.
func (m *module) check(r ref) string {
	best, bestDepth := "", -1
	for _, p := range r.pkgs {
		depth, msg := m.checkIn(p, r.names)
		if msg == "" {
			return ""
		}
		if depth > bestDepth {
			best, bestDepth = msg, depth
		}
	}
	return best
}

func (m *module) checkIn(p *pkg, names []string) (int, string) {
	l, cur := m.topLevel(p, names[0])
	if l == missing {
		return 0, fmt.Sprintf("package %s has no %s", p.name, names[0])
	}
	for i, n := range names[1:] {
		if cur == nil {
			return i + 1, "" // cannot follow the type: accept
		}
		l, next := m.member(*cur, n, map[typeRef]bool{})
		switch l {
		case missing:
			return i + 1, fmt.Sprintf("type %s has no field or method %s", cur.name, n)
		case unknown:
			return i + 1, ""
		}
		cur = next
	}
	return len(names), ""
}
