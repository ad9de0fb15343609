package httpapi

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"sync"
	"time"
)

// The default lifetimes of a dashboard session (see Config.SessionIdle and
// Config.SessionMax).
const (
	DefaultSessionIdle = 30 * time.Minute
	DefaultSessionMax  = 12 * time.Hour
)

// session is one browser's login: the cookie holds only its random ID;
// the token it was opened with is known here by its hash, so that the
// session ends when that token leaves the tokens file.
type session struct {
	token   [32]byte // SHA-256 of the token logged in with
	name    string   // the token's name at login, for the log
	created time.Time
	last    time.Time
}

// sessions are the live dashboard sessions, in memory: a restart of the
// server logs everyone out. They are keyed by the SHA-256 of their ID, so
// a lookup's timing says nothing about the IDs held.
type sessions struct {
	mu   sync.Mutex
	m    map[[32]byte]*session
	idle time.Duration
	max  time.Duration
	now  func() time.Time
}

func newSessions(idle, max time.Duration, now func() time.Time) *sessions {
	return &sessions{m: map[[32]byte]*session{}, idle: idle, max: max, now: now}
}

// Why a session cookie was not accepted (the auth failure reasons).
const (
	reasonNoSession    = "unknown_session"
	reasonExpired      = "expired_session"
	reasonTokenRemoved = "token_removed"
)

// open starts a session for a token (by its hash) and returns its ID: 32
// bytes from crypto/rand, hex.
func (ss *sessions) open(token [32]byte, name string) (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	id := hex.EncodeToString(b)
	now := ss.now()
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for k, s := range ss.m {
		if ss.expired(s, now) {
			delete(ss.m, k)
		}
	}
	ss.m[sha256.Sum256([]byte(id))] = &session{token: token, name: name, created: now, last: now}
	return id, nil
}

func (ss *sessions) expired(s *session, now time.Time) bool {
	return now.Sub(s.last) > ss.idle || now.Sub(s.created) > ss.max
}

// use returns the identity of a live session and marks it used; else why
// not (and the name of its token, when known). An expired session, or one
// whose token is no longer in tokens, ends.
func (ss *sessions) use(id string, tokens *Tokens) (Identity, string, string) {
	k := sha256.Sum256([]byte(id))
	now := ss.now()
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s, ok := ss.m[k]
	if !ok {
		return Identity{}, "", reasonNoSession
	}
	if ss.expired(s, now) {
		delete(ss.m, k)
		return Identity{}, s.name, reasonExpired
	}
	who, ok := tokens.lookupSum(s.token)
	if !ok {
		delete(ss.m, k)
		return Identity{}, s.name, reasonTokenRemoved
	}
	s.last = now
	return who, s.name, ""
}

// end ends a session (logout); false if there was none.
func (ss *sessions) end(id string) bool {
	k := sha256.Sum256([]byte(id))
	ss.mu.Lock()
	defer ss.mu.Unlock()
	_, ok := ss.m[k]
	delete(ss.m, k)
	return ok
}

// prune ends every session whose token is not in tokens, and returns how
// many ended.
func (ss *sessions) prune(tokens *Tokens) int {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	n := 0
	for k, s := range ss.m {
		if _, ok := tokens.lookupSum(s.token); !ok {
			delete(ss.m, k)
			n++
		}
	}
	return n
}
