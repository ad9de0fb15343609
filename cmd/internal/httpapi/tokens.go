package httpapi

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// Role is what a token may do.
type Role string

// The roles of a tokens file.
const (
	// RoleRead reads: runs, steps, items, schedules.
	RoleRead Role = "read"
	// RoleOperate reads, starts runs and operates on them (resume, rerun,
	// reset, abandon, recover, resolve).
	RoleOperate Role = "operate"
)

// allows reports whether r may do what need asks.
func (r Role) allows(need Role) bool { return r == RoleOperate || r == need }

// Identity is who a request comes from: the name and role of its token.
type Identity struct {
	Name string `json:"name"`
	Role Role   `json:"role"`
}

// Token is one line of a tokens file.
type Token struct {
	Name  string
	Role  Role
	Value string
}

// Tokens are the bearer tokens a server accepts. The zero value accepts
// none.
type Tokens struct {
	tokens []Token
}

// ErrBadTokens is wrapped by every error of ParseTokens and ReadTokens.
var ErrBadTokens = errors.New("httpapi: bad tokens file")

// MinTokenLength is the shortest token accepted, in characters: a token
// is a password, so it must not be guessable (64 random hex digits:
// `openssl rand -hex 32`).
const MinTokenLength = 32

// minTokenVariety is the fewest distinct characters a token may have: 32
// random hex digits have about 14; "aaaa…" or "abab…" have 1 or 2.
const minTokenVariety = 10

// MakeTokenHint is the command the refusals of a weak token name.
const MakeTokenHint = "`openssl rand -hex 32`"

// ReadTokens reads a tokens file (see ParseTokens). A file that its group
// or others may read or write is refused, as ssh refuses such a private
// key: the tokens are passwords.
func ReadTokens(path string) (*Tokens, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadTokens, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadTokens, err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("%w: %s has mode %04o: its group or others may read it, and its tokens are passwords; "+
			"run `chmod 600 %s` (as ssh refuses such a private key)", ErrBadTokens, path, perm, path)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadTokens, err)
	}
	t, err := ParseTokens(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// ParseTokens parses a tokens file: one NAME:ROLE:TOKEN a line, ROLE read
// or operate, TOKEN at least MinTokenLength characters that do not look
// made by hand (few distinct characters, a run repeated, characters in sequence, are
// refused); blank lines and lines
// starting with # are skipped. Names and tokens are unique. An error
// names the line and what is wrong with it (never the token).
func ParseTokens(b []byte) (*Tokens, error) {
	t := &Tokens{}
	names := map[string]int{}
	values := map[[32]byte]int{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, rest, ok1 := strings.Cut(line, ":")
		role, value, ok2 := strings.Cut(rest, ":")
		name, role, value = strings.TrimSpace(name), strings.TrimSpace(role), strings.TrimSpace(value)
		bad := func(format string, args ...any) error {
			return fmt.Errorf("%w: line %d: %s", ErrBadTokens, n, fmt.Sprintf(format, args...))
		}
		switch {
		case !ok1 || !ok2:
			return nil, bad("want NAME:ROLE:TOKEN (ROLE read or operate)")
		case name == "" || strings.ContainsAny(name, " \t"):
			return nil, bad("the name is empty or holds a space; want NAME:ROLE:TOKEN")
		case Role(role) != RoleRead && Role(role) != RoleOperate:
			return nil, bad("role %q of %s is neither read nor operate", role, name)
		case len(value) < MinTokenLength:
			return nil, bad("the token of %s is %d characters; use at least %d random ones: make one with %s", name, len(value), MinTokenLength, MakeTokenHint)
		case lowVariety(value):
			return nil, bad("the token of %s does not look random (few distinct characters, a run repeated, or characters in sequence); make one with %s", name, MakeTokenHint)
		}
		if first, dup := names[name]; dup {
			return nil, bad("name %s is already used on line %d", name, first)
		}
		sum := sha256.Sum256([]byte(value))
		if first, dup := values[sum]; dup {
			return nil, bad("the token of %s is the token of line %d; give each its own", name, first)
		}
		names[name], values[sum] = n, n
		t.tokens = append(t.tokens, Token{Name: name, Role: Role(role), Value: value})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadTokens, err)
	}
	if len(t.tokens) == 0 {
		return nil, fmt.Errorf("%w: no token in it; add a line NAME:ROLE:TOKEN", ErrBadTokens)
	}
	return t, nil
}

// lowVariety reports whether a token is visibly not random: fewer than
// minTokenVariety distinct characters, a shorter string repeated, one
// character making up a quarter of it, a run of 8 or more characters in
// sequence (abcdefgh, 12345678, and their reverse), or a piece of 8 or more
// characters that appears twice (passwordpassword). A token from
// `openssl rand -hex 32` or `-base64 32` passes.
func lowVariety(v string) bool {
	count := map[rune]int{}
	for _, c := range v {
		count[c]++
	}
	if len(count) < minTokenVariety {
		return true
	}
	for _, n := range count {
		if n*4 > len(v) && n >= 12 { // 12: never by chance in 32 random hex digits
			return true
		}
	}
	for p := 1; p <= len(v)/2; p++ {
		if strings.Repeat(v[:p], len(v)/p+1)[:len(v)] == v {
			return true
		}
	}
	up, down := 1, 1
	for i := 1; i < len(v); i++ {
		if up = next(up, v[i] == v[i-1]+1); up >= 8 {
			return true
		}
		if down = next(down, v[i] == v[i-1]-1); down >= 8 {
			return true
		}
	}
	const piece = 8
	seen := map[string]int{}
	for i := 0; i+piece <= len(v); i++ {
		if j, ok := seen[v[i:i+piece]]; ok && i-j >= piece {
			return true
		}
		if _, ok := seen[v[i:i+piece]]; !ok {
			seen[v[i:i+piece]] = i
		}
	}
	return false
}

// next is a run's length after one more character: one longer if it goes
// on, else 1.
func next(run int, goesOn bool) int {
	if goesOn {
		return run + 1
	}
	return 1
}

// Len is how many tokens t holds.
func (t *Tokens) Len() int {
	if t == nil {
		return 0
	}
	return len(t.tokens)
}

// Lookup returns the identity of a presented token. Every token is
// compared, each in constant time, so the time taken says nothing about
// which token, or how much of one, matched.
func (t *Tokens) Lookup(presented string) (Identity, bool) {
	// Hashes compare in constant time whatever the lengths.
	return t.lookupSum(sha256.Sum256([]byte(presented)))
}

// lookupSum is Lookup of a token by its SHA-256 (what a session keeps).
func (t *Tokens) lookupSum(p [32]byte) (Identity, bool) {
	if t == nil {
		return Identity{}, false
	}
	var found Identity
	ok := 0
	for _, tok := range t.tokens {
		v := sha256.Sum256([]byte(tok.Value))
		if subtle.ConstantTimeCompare(p[:], v[:]) == 1 {
			found, ok = Identity{Name: tok.Name, Role: tok.Role}, 1
		}
	}
	return found, ok == 1
}
