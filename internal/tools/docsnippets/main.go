// Command docsnippets keeps documentation code identical to compiled code.
//
// A Markdown file marks a fenced code block with a comment on the line
// before it:
//
//	<!-- snippet: bus/example_test.go#quickstart -->
//	```go
//	...
//	```
//
// and the Go source brackets the same lines with "// snippet:start
// quickstart" and "// snippet:end quickstart". The command fails, naming
// the file and snippet, when a block differs from its source (after removing
// the common indentation), when a source or snippet is missing, or with -fix
// rewrites the blocks from their sources.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

var marker = regexp.MustCompile(`^<!--\s*snippet:\s*([^#\s]+)#([\w.-]+)\s*-->\s*$`)

func main() {
	fix := flag.Bool("fix", false, "rewrite doc blocks from their sources")
	flag.Parse()
	var files []string
	for _, pattern := range []string{"README.md", "docs/*.md", "samples/*/README.md"} {
		m, _ := filepath.Glob(pattern)
		files = append(files, m...)
	}
	problems, checked := 0, 0
	for _, f := range files {
		n, errs := process(f, *fix)
		checked += n
		for _, e := range errs {
			fmt.Fprintln(os.Stderr, e)
			problems++
		}
	}
	if problems > 0 {
		fmt.Fprintf(os.Stderr, "docsnippets: %d problem(s); run `go run ./internal/tools/docsnippets -fix` after changing the sources\n", problems)
		os.Exit(1)
	}
	fmt.Printf("docsnippets: %d snippet(s) in %d file(s) match their sources\n", checked, len(files))
}

func process(path string, fix bool) (int, []error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, []error{err}
	}
	lines := strings.Split(string(data), "\n")
	var out []string
	var errs []error
	n := 0
	for i := 0; i < len(lines); i++ {
		out = append(out, lines[i])
		m := marker.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		n++
		if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "```") {
			errs = append(errs, fmt.Errorf("%s:%d: snippet marker not followed by a code fence", path, i+1))
			continue
		}
		end := i + 2
		for end < len(lines) && !strings.HasPrefix(lines[end], "```") {
			end++
		}
		if end >= len(lines) {
			errs = append(errs, fmt.Errorf("%s:%d: unterminated code block", path, i+2))
			continue
		}
		want, err := extract(m[1], m[2])
		if err != nil {
			errs = append(errs, fmt.Errorf("%s:%d: %w", path, i+1, err))
			continue
		}
		got := strings.Join(lines[i+2:end], "\n")
		if got != want && !fix {
			errs = append(errs, fmt.Errorf("%s:%d: snippet %s#%s differs from its source", path, i+1, m[1], m[2]))
		}
		out = append(out, lines[i+1])
		if fix {
			out = append(out, strings.Split(want, "\n")...)
		} else {
			out = append(out, lines[i+2:end]...)
		}
		out = append(out, lines[end])
		i = end
	}
	if fix {
		if err := os.WriteFile(path, []byte(strings.Join(out, "\n")), 0o644); err != nil {
			errs = append(errs, err)
		}
	}
	return n, errs
}

func extract(file, name string) (string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("snippet source: %w", err)
	}
	var body []string
	in, found := false, false
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		t := strings.TrimSpace(sc.Text())
		switch {
		case t == "// snippet:start "+name:
			in, found = true, true
		case t == "// snippet:end "+name:
			in = false
		case in:
			body = append(body, sc.Text())
		}
	}
	if !found {
		return "", fmt.Errorf("snippet %q not found in %s", name, file)
	}
	for len(body) > 0 && strings.TrimSpace(body[0]) == "" {
		body = body[1:]
	}
	for len(body) > 0 && strings.TrimSpace(body[len(body)-1]) == "" {
		body = body[:len(body)-1]
	}
	return dedent(body), nil
}

func dedent(lines []string) string {
	prefix := ""
	first := true
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		ws := l[:len(l)-len(strings.TrimLeft(l, " \t"))]
		if first || !strings.HasPrefix(ws, prefix) {
			if first {
				prefix = ws
				first = false
			} else {
				for !strings.HasPrefix(ws, prefix) {
					prefix = prefix[:len(prefix)-1]
				}
			}
		}
	}
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = strings.TrimPrefix(l, prefix)
		if strings.TrimSpace(l) == "" {
			out[i] = ""
		}
	}
	return strings.Join(out, "\n")
}
