package admin

import (
	"context"
	"fmt"
	"time"

	"github.com/ledgerline/outbox/internal/store"
)

// pauseOf returns the pause in pauses that holds railType: its own, else
// that of every rail; nil when none does.
func pauseOf(pauses []store.RailPause, railType string) *store.RailPause {
	var all *store.RailPause
	for i, p := range pauses {
		switch p.RailType {
		case railType:
			return &pauses[i]
		case store.AllRails:
			all = &pauses[i]
		}
	}
	return all
}

// pauseName names what a pause pauses, as a sentence says it.
func pauseName(p *store.RailPause) string {
	if p.RailType == store.AllRails {
		return "every rail"
	}
	return "rail " + p.RailType
}

// participantView is store.Participant, whose reason for a head that is
// due or waiting for a retry also says when a pause of its rail holds it:
// store's "waiting for a relayer to claim it" is untrue then, as no
// relayer claims it until the resume.
func (s *Server) participantView(ctx context.Context, participant string) (store.ParticipantView, error) {
	v, err := s.store.Participant(ctx, s.cfg.Pool, participant)
	if err != nil || v.Head == nil || (v.State != "due" && v.State != "retry_wait") {
		return v, err
	}
	pauses, err := s.store.RailPauses(ctx, s.cfg.Pool)
	if err != nil {
		return v, fmt.Errorf("participant %s: %w", participant, err)
	}
	p := pauseOf(pauses, v.Head.RailType)
	if p == nil {
		return v, nil
	}
	held := fmt.Sprintf("held by the pause of %s (by %s: %s) since %s: no relayer claims it until the rail is resumed",
		pauseName(p), p.PausedBy, p.Reason, p.PausedAt.UTC().Format(time.RFC3339))
	// Its rail's own pause and that of every rail both hold it: resuming
	// one leaves it held, which the reason must not hide.
	if all := pauseOf(pauses, store.AllRails); all != nil && all != p {
		held += fmt.Sprintf("; every rail is paused too (by %s: %s), and that pause holds it as well", all.PausedBy, all.Reason)
	}
	if v.State == "retry_wait" {
		v.Reason += ", and then " + held
		return v, nil
	}
	lastError := ""
	if v.LastError != "" {
		lastError = " (last error " + v.LastError + ")"
	}
	due := "" // store sets NextAttempt for a due head; a missing one is left out
	if v.Head.NextAttempt != nil {
		due = " since " + v.Head.NextAttempt.UTC().Format(time.RFC3339)
	}
	v.Reason = fmt.Sprintf("sequence %d has been due%s%s, but is %s", v.Head.SequenceID, due, lastError, held)
	return v, nil
}
