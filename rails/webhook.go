package rails

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/internal/strictjson"
	"github.com/ledgerline/outbox/payment"
)

const (
	// webhookMaxResponseBytes bounds what is read from an answer: a rail
	// (or something impersonating it) must not be able to make the relayer
	// buffer an unbounded body.
	webhookMaxResponseBytes = 64 << 10
	// webhookMaxText bounds Reference and Message (bytes), which end up in
	// attempt rows, logs and metrics exemplars.
	webhookMaxText = 1000
	// webhookMaxRetryAfter caps a rail's Retry-After: a misconfigured or
	// hostile rail must not park instructions for days.
	webhookMaxRetryAfter = MaxRetryAfter
	// webhookRedacted replaces the secret wherever options are printed.
	webhookRedacted = "[REDACTED]"
)

// WebhookCodes is the webhook transport's code table. Its codes are the HTTP
// status of the answer, as "HTTP_<status>". Statuses that are not listed
// (3xx, 404, 418, ...) deliberately fall through to [CodeTable.Decide]'s
// default, a retryable UNKNOWN_RAIL_CODE that an operator is expected to
// look at: guessing would either pay twice or drop a payment.
var WebhookCodes = CodeTable{
	"HTTP_200": {Outcome: Dispatched},
	"HTTP_201": {Outcome: Dispatched},
	"HTTP_202": {Outcome: Dispatched},
	"HTTP_204": {Outcome: Dispatched},
	// 409: the receiver already has this idempotency key, so the original
	// request was acted on; the instruction is done. A receiver that
	// answers 409 while the original is still in progress (it may yet
	// fail) does not speak this protocol: its rail maps HTTP_409 to a
	// retry (docs/relay-config.md, "Codes").
	"HTTP_409": {Outcome: Dispatched},
	"HTTP_400": {Outcome: Failed, Error: CodeRailRejected},
	"HTTP_422": {Outcome: Failed, Error: CodeRailRejected},
	"HTTP_408": {Outcome: Retryable, Error: CodeRailTimeout},
	"HTTP_429": {Outcome: Retryable, Error: CodeRateLimited},
	// 503 is a refusal before processing (overloaded, in maintenance): the
	// request was not acted on.
	"HTTP_503": {Outcome: Retryable, Error: CodeRailUnavailable},
	// 500, 502 and 504 prove nothing: the receiver may have paid and then
	// failed, or a gateway may have passed the payment on and lost (502) or
	// waited too long for (504) the answer. Retried with the same key, and
	// a dead letter after them is outcome unknown.
	"HTTP_500": {Outcome: Retryable, Error: CodeRailUpstreamError},
	"HTTP_502": {Outcome: Retryable, Error: CodeRailUpstreamError},
	"HTTP_504": {Outcome: Retryable, Error: CodeRailUpstreamError},
	// 401/403: the rail refused to act on any request of ours, which is a
	// configuration problem (wrong secret, revoked access), not a verdict on
	// this instruction. Retryable, so the breaker opens and instructions wait
	// for the fix instead of all being dead-lettered.
	"HTTP_401": {Outcome: Retryable, Error: CodeRailUnavailable},
	"HTTP_403": {Outcome: Retryable, Error: CodeRailUnavailable},
}

// webhookCode is the code of an HTTP status in [WebhookCodes].
func webhookCode(status int) string { return "HTTP_" + strconv.Itoa(status) }

// isWebhookCode reports whether the webhook transport can answer code:
// webhookCode of a three-digit status (net/http reads nothing else).
func isWebhookCode(code string) bool {
	status, ok := strings.CutPrefix(code, "HTTP_")
	return ok && len(status) == 3 && isDigits(status) && status[0] != '0'
}

// WebhookOptions configure a [Webhook].
//
// Printing the options (fmt with any verb, slog, encoding/json) never shows
// the secret.
type WebhookOptions struct {
	// URL is the endpoint. It must be https://, except that http:// is
	// allowed for loopback hosts (tests, a local sandbox). It must not carry
	// credentials: authentication is the HMAC signature.
	URL string
	// Secret is the HMAC-SHA256 key shared with the receiver (at least 32
	// random bytes recommended; see [LoadSecret]).
	Secret []byte `json:"-"`
	// RotatingSecret, instead of Secret, is a secret that can change while
	// the process runs (a secret file, see [RotatingSecret]): every
	// request is signed with the secret in force when it is signed.
	RotatingSecret *RotatingSecret `json:"-"`
	// CAFile is an optional PEM file of extra root CAs, added to the system
	// roots (or to RootCAs). TLS verification cannot be turned off.
	CAFile string
	// RootCAs, if set, replaces the system roots (tests use the certificate
	// of httptest.NewTLSServer).
	RootCAs *x509.CertPool
	// Client, if set, is used instead of the built-in client. It must not
	// skip TLS verification (checked on its *http.Transport, or on
	// http.DefaultTransport when it has none; a RoundTripper of another
	// type is the caller's to vouch for), and cannot be combined with
	// CAFile or RootCAs.
	// Redirects are never followed whatever its CheckRedirect says.
	Client *http.Client
	// Codes overrides [WebhookCodes].
	Codes CodeTable
	// ConnectionMaxAge is how long the built-in client sends new requests
	// over the connections it opened before it opens new ones, resolving
	// the host again: a rail endpoint moved by DNS is reached at its new
	// address within about this long, also under a steady load that never
	// leaves a connection idle (zero: [DefaultConnectionMaxAge]). A request
	// in flight is never cut. It does not apply to Client.
	ConnectionMaxAge time.Duration
}

// String describes the options with the secret redacted.
func (o WebhookOptions) String() string {
	secret := "<empty>"
	switch {
	case len(o.Secret) > 0:
		secret = webhookRedacted
	case o.RotatingSecret != nil:
		secret = webhookRedacted + " (rotating)"
	}
	return fmt.Sprintf("rails.WebhookOptions{URL:%s Secret:%s CAFile:%q RootCAs:%t Client:%t Codes:%d ConnectionMaxAge:%s}",
		redactURLString(o.URL), secret, o.CAFile, o.RootCAs != nil, o.Client != nil, len(o.Codes), o.ConnectionMaxAge)
}

// Format makes every fmt verb (%v, %+v, %#v, %x, %d, ...) print [String]:
// without it, %+v or %d would walk the struct and print the secret's bytes.
func (o WebhookOptions) Format(f fmt.State, _ rune) { io.WriteString(f, o.String()) }

// LogValue implements [slog.LogValuer] so structured logs get the redacted
// form too (slog's JSON handler would otherwise marshal the fields).
func (o WebhookOptions) LogValue() slog.Value { return slog.StringValue(o.String()) }

// Webhook is a [Transport] that POSTs instructions to an HTTPS endpoint.
//
// # Protocol
//
// Each dispatch is one request:
//
//	POST <URL>
//	Content-Type: application/json
//	Idempotency-Key: <idempotency_key>
//	X-Outbox-Timestamp: <unix seconds>
//	X-Outbox-Signature: v1=<lowercase hex HMAC-SHA256(secret, timestamp + "." + body)>
//	X-Outbox-Attempt: <attempt number, 1, 2, ...; informational, not signed>
//	X-Outbox-Attempt-Id: <the attempt's id in the archive; informational, not signed>
//
// with a [WebhookRequest] as the JSON body. An instruction whose key would
// not reach the receiver unchanged in the Idempotency-Key header (a
// leading or trailing space, which HTTP drops, a control character, or
// anything beyond ASCII, which receivers may decode as ISO-8859-1) is
// refused before anything is sent, as VALIDATION_FAILED. The body of every attempt of one
// instruction is byte-identical (the attempt's number and id are only in
// the X-Outbox-Attempt headers), so a receiver that fingerprints the payload per
// idempotency key sees a retry as the same request. The receiver verifies
// the signature, the timestamp and that the Idempotency-Key header names
// the body's idempotency_key (see [VerifySignature]), and must honour the
// idempotency key: a repeated key is answered 409 (or the original 2xx)
// without acting again. A 409 is recorded as dispatched, so it must mean
// that the original request was acted on: while the original is still in
// progress the receiver answers something retryable (503 or 429, with a
// Retry-After) or waits for it. Retries after a timeout carry the same key, which
// is what makes them safe.
//
// The answer's status becomes Result.Code "HTTP_<status>", classified by
// [WebhookCodes]. The body may be JSON {"reference": "...", "message":
// "..."} (read up to 64 KiB): on a 2xx or 409 the reference is the
// receiver's id of the payment; the message, kept for any status so a
// rejection says why, is sanitized and cut to 1000 bytes (as is the
// reference, on a character boundary). A
// Retry-After header (seconds or HTTP-date) becomes Result.RetryAfter,
// capped at one hour. Redirects are not followed: a payment is only ever
// sent to the configured URL.
//
// When no answer is obtained, Send returns an error instead of a Result, so
// [CodeTable.Decide] classifies it by type: a context deadline is
// RAIL_TIMEOUT, a refused or failed dial is RAIL_UNAVAILABLE, anything else
// RAIL_TRANSPORT_ERROR. A refused or failed dial is only RAIL_UNAVAILABLE if
// no byte of the request was written during the Send: net/http replays a
// request carrying an Idempotency-Key on a new connection when a pooled one
// breaks after the request was written, and a refused re-dial then says
// nothing about the first write (RAIL_TRANSPORT_ERROR). Errors never contain
// the secret, the signature, or the URL's path, query or credentials (only
// scheme://host[:port]).
//
// A Webhook is safe for concurrent use. Its secret is held only inside a
// signing closure, so even printing a copied Webhook value with fmt cannot
// reveal it; and fmt, with any verb, and slog print only scheme://host[:port]
// of its URL.
type Webhook struct {
	url     string // the request URL
	safeURL string // scheme://host[:port] only, for errors and String
	client  *http.Client
	codes   CodeTable
	sign    func(timestamp string, body []byte) string
	now     func() time.Time // tests pin the clock
	// rotating is the secret that sign reads when it can change (nil: a
	// fixed secret, held only in sign's closure).
	rotating *RotatingSecret
}

// NewWebhook checks the options and builds a webhook transport.
func NewWebhook(o WebhookOptions) (*Webhook, error) {
	u, err := url.Parse(o.URL)
	if err != nil {
		// url.Parse's error quotes the whole URL; keep it out of logs.
		return nil, errors.New("rails: webhook URL does not parse")
	}
	switch {
	case u.Host == "":
		return nil, errors.New("rails: webhook URL has no host")
	case u.User != nil:
		return nil, errors.New("rails: webhook URL must not carry credentials; authentication is the HMAC secret")
	case u.Scheme == "https":
	case u.Scheme == "http" && isLoopbackHost(u.Hostname()):
	case u.Scheme == "http":
		return nil, fmt.Errorf("rails: webhook URL must be https:// (http:// is only allowed for loopback hosts, not %q)", u.Hostname())
	default:
		return nil, fmt.Errorf("rails: webhook URL scheme %q is not supported; use https://", u.Scheme)
	}
	switch {
	case len(o.Secret) > 0 && o.RotatingSecret != nil:
		return nil, errors.New("rails: webhook takes a Secret or a RotatingSecret, not both")
	case len(o.Secret) == 0 && o.RotatingSecret == nil:
		return nil, errors.New("rails: webhook secret is empty")
	case o.ConnectionMaxAge < 0:
		return nil, fmt.Errorf("rails: webhook ConnectionMaxAge %s is negative", o.ConnectionMaxAge)
	case o.ConnectionMaxAge > 0 && o.Client != nil:
		return nil, errors.New("rails: webhook ConnectionMaxAge applies to the built-in client, not to Client")
	}

	client, err := webhookClient(o)
	if err != nil {
		return nil, err
	}
	codes := o.Codes
	if codes == nil {
		codes = WebhookCodes
	}
	w := &Webhook{
		url:      u.String(),
		safeURL:  redactURL(u),
		client:   client,
		codes:    codes,
		now:      time.Now,
		rotating: o.RotatingSecret,
	}
	if rs := o.RotatingSecret; rs != nil {
		// Each request reads the secret in force once: a rotation never
		// mixes two secrets in one signature.
		w.sign = func(ts string, body []byte) string { return Sign(rs.Key(), ts, body) }
	} else {
		key := bytes.Clone(o.Secret) // the caller may zero or reuse its slice
		w.sign = func(ts string, body []byte) string { return Sign(key, ts, body) }
	}
	return w, nil
}

// RotatingSecret returns the rotating secret the webhook signs with, or
// nil for a fixed secret; [Set.ReloadSecrets] reloads it.
func (w *Webhook) RotatingSecret() *RotatingSecret { return w.rotating }

// webhookClient returns the caller's client (checked, redirects disabled)
// or builds one.
func webhookClient(o WebhookOptions) (*http.Client, error) {
	if o.Client != nil {
		if o.CAFile != "" || o.RootCAs != nil {
			return nil, errors.New("rails: webhook Client cannot be combined with CAFile or RootCAs; configure the client's TLS roots instead")
		}
		rt := o.Client.Transport
		if rt == nil {
			// What the client sends through; a program may have set it
			// to skip verification.
			rt = http.DefaultTransport
		}
		if tr, ok := rt.(*http.Transport); ok && tr.TLSClientConfig != nil && tr.TLSClientConfig.InsecureSkipVerify {
			return nil, errors.New("rails: webhook Client skips TLS verification; that is never allowed for a payment rail")
		}
		c := *o.Client // shallow copy: the caller's client stays as it was
		c.CheckRedirect = refuseRedirect
		return &c, nil
	}

	roots := o.RootCAs
	if o.CAFile != "" {
		pem, err := os.ReadFile(o.CAFile)
		if err != nil {
			return nil, fmt.Errorf("rails: webhook CA file: %w", err)
		}
		if roots != nil {
			roots = roots.Clone()
		} else if roots, err = x509.SystemCertPool(); err != nil {
			roots = x509.NewCertPool() // no system roots: trust just the file
		}
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("rails: webhook CA file %q holds no PEM certificate", o.CAFile)
		}
	}
	// Like http.DefaultTransport, but with enough idle connections per host
	// for a rail's full concurrency (DefaultMaxConcurrency), so a busy relayer
	// does not handshake on most requests. There is no Client.Timeout: the
	// relayer's per-dispatch context carries the hard timeout.
	newTransport := func() *http.Transport {
		return &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			ForceAttemptHTTP2:     true,
			MaxIdleConns:          256,
			MaxIdleConnsPerHost:   2 * DefaultMaxConcurrency,
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   10 * time.Second,
			ExpectContinueTimeout: time.Second,
			TLSClientConfig:       &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots},
		}
	}
	age := o.ConnectionMaxAge
	if age == 0 {
		age = DefaultConnectionMaxAge
	}
	return &http.Client{Transport: newRenewingTransport(newTransport, age), CheckRedirect: refuseRedirect}, nil
}

// refuseRedirect hands a 3xx back as the answer: re-POSTing a signed
// payment to a location we were not configured with is not acceptable, and
// the unknown HTTP_3xx code gets an operator's attention.
func refuseRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// isLoopbackHost reports whether plain http:// is acceptable for host.
func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// redactURL keeps only scheme://host[:port], which is what an operator
// needs to recognise the endpoint. Everything else may hold a token:
// credentials, query and fragment, and the path too (Slack-style hook URLs
// carry their secret in the path). The result ends up in error messages,
// which are stored in the attempt archive and logged.
func redactURL(u *url.URL) string {
	if u.Host == "" {
		return "<no host>" // never fall back to showing the path
	}
	return u.Scheme + "://" + u.Host
}

func redactURLString(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "<invalid>"
	}
	return redactURL(u)
}

// String describes the webhook without its secret, and without its URL's
// path and query, which may hold a token.
func (w Webhook) String() string { return "rails.Webhook{URL:" + w.safeURL + "}" }

// Format makes every fmt verb, %#v included, print [Webhook.String], for
// a *Webhook and a copied value alike: otherwise they walk the struct and
// print the full URL.
func (w Webhook) Format(f fmt.State, _ rune) { io.WriteString(f, w.String()) }

// LogValue implements [slog.LogValuer] with the redacted form.
func (w Webhook) LogValue() slog.Value { return slog.StringValue(w.String()) }

// Codes implements [CodeProvider].
func (w *Webhook) Codes() CodeTable { return w.codes }

// webhookAnswer is the optional JSON body of an answer.
type webhookAnswer struct {
	Reference string `json:"reference"`
	Message   string `json:"message"`
}

// Send implements [Transport]: it signs and POSTs the instruction and turns
// the HTTP answer into a Result (see the protocol in [Webhook]).
func (w *Webhook) Send(ctx context.Context, ins payment.Instruction) (Result, error) {
	if ins.IdempotencyKey == "" {
		// Without a key a retry could pay twice; never send such a request.
		return Result{}, payment.Invalid(payment.FieldIdempotencyKey, payment.ReasonRequired, "the webhook rail needs an idempotency key")
	}
	if !headerExact(ins.IdempotencyKey) {
		// net/http would drop the surrounding spaces (another key at the
		// receiver), refuse to send a control character, or send bytes
		// beyond ASCII that receivers may read as another key: terminal.
		return Result{}, payment.Invalid(payment.FieldIdempotencyKey, payment.ReasonInvalid,
			"the idempotency key cannot travel unchanged in the %s header", HeaderIdempotencyKey)
	}
	// The body must not depend on anything that changes between attempts
	// (see HeaderAttempt): NewWebhookRequest leaves AttemptNo out.
	body, err := json.Marshal(NewWebhookRequest(ins))
	if err != nil {
		// Only the raw metadata can fail to encode, and it would fail on
		// every retry: terminal, and the rail is never called.
		return Result{}, payment.Invalid(payment.FieldMetadata, payment.ReasonInvalid, "metadata is not valid JSON")
	}
	// wrote records whether any byte of the request went out on any
	// connection during this Send, including a retry net/http makes by
	// itself; see transportError.
	var wrote atomic.Bool
	trace := &httptrace.ClientTrace{
		// WroteHeaders fires once the headers are handed to the
		// connection (they may already be on the wire); WroteRequest also
		// fires when writing failed part way. Either means the rail may
		// have seen the request.
		WroteHeaders: func() { wrote.Store(true) },
		WroteRequest: func(httptrace.WroteRequestInfo) { wrote.Store(true) },
	}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodPost, w.url, bytes.NewReader(body))
	if err != nil {
		return Result{}, fmt.Errorf("webhook %s: building request: %w", w.safeURL, err)
	}
	ts := strconv.FormatInt(w.now().Unix(), 10)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	// Besides telling the receiver what to deduplicate on, this header lets
	// net/http replay the request itself on a new connection when a pooled
	// one breaks after the request was written (hence the trace above).
	req.Header.Set(HeaderIdempotencyKey, ins.IdempotencyKey)
	req.Header.Set(HeaderTimestamp, ts)
	req.Header.Set(HeaderSignature, w.sign(ts, body))
	if ins.AttemptNo > 0 {
		req.Header.Set(HeaderAttempt, strconv.Itoa(ins.AttemptNo))
	}
	if ins.AttemptID != uuid.Nil {
		req.Header.Set(HeaderAttemptID, ins.AttemptID.String())
	}

	resp, err := w.client.Do(req)
	if err != nil {
		return Result{}, w.transportError(ctx, err, wrote.Load())
	}
	defer resp.Body.Close()

	res := Result{
		Code:       webhookCode(resp.StatusCode),
		RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), w.now()),
	}
	// The status is the answer; the body is optional detail. A body that
	// cannot be read or parsed therefore does not turn an explicit answer
	// into an error.
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, webhookMaxResponseBytes))
	var ans webhookAnswer
	switch err := strictjson.UnmarshalKnown(raw, &ans); {
	case err == nil:
		ok := resp.StatusCode/100 == 2 || resp.StatusCode == http.StatusConflict
		if ok {
			res.Reference = CleanText(ans.Reference, webhookMaxText)
		}
		// A rejection's message is what tells an operator why, so it is
		// kept for every status; it never decides anything.
		res.Message = CleanText(ans.Message, webhookMaxText)
	case bytes.HasPrefix(bytes.TrimSpace(raw), []byte("{")):
		// A JSON answer we refuse to read (a repeated "reference", say):
		// keep no reference from it, and say why.
		res.Message = CleanText("answer body refused: "+err.Error(), webhookMaxText)
	}
	return res, nil
}

// transportError prepares an http.Client error for [CodeTable.Decide]: it
// keeps the error chain (context.DeadlineExceeded, *net.OpError,
// syscall.ECONNREFUSED) intact, makes sure a deadline classifies as a
// timeout whichever layer noticed it, and shows only scheme://host[:port]
// of the URL.
//
// wrote says whether any byte of the request was written during the Send.
// If it was, a refused or failed dial in the chain comes from net/http's
// own replay on a new connection and proves nothing about the first write:
// the error is marked with errRequestWritten so it never classifies as
// "not sent" (RAIL_UNAVAILABLE, rail not called).
func (w *Webhook) transportError(ctx context.Context, err error, wrote bool) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		ue.URL = w.safeURL
	}
	if wrote && notSent(err) {
		err = fmt.Errorf("%w (%w)", err, errRequestWritten)
	}
	if !errors.Is(err, context.DeadlineExceeded) && !notSent(err) {
		// net/http reports context.Cause(ctx), which is not
		// DeadlineExceeded under context.WithTimeoutCause; and a
		// timeout inside the exchange (net.Error.Timeout) is a timeout
		// too. Either way the rail may have acted: RAIL_TIMEOUT.
		var ne net.Error
		if errors.Is(ctx.Err(), context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
			return fmt.Errorf("webhook: %w (%w)", err, context.DeadlineExceeded)
		}
	}
	return fmt.Errorf("webhook: %w", err)
}

// headerExact reports whether a header value reaches the receiver as
// given: printable ASCII only (net/http refuses control characters, and
// sends other bytes raw, which receivers may decode as ISO-8859-1) and no
// leading or trailing space (HTTP drops it).
func headerExact(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c >= 0x7f {
			return false
		}
	}
	return v == strings.Trim(v, " ")
}

// isDigits reports whether s is made of ASCII digits only (true for "":
// callers check emptiness themselves).
func isDigits(s string) bool { return strings.Trim(s, "0123456789") == "" }

// parseRetryAfter reads a Retry-After value, delta-seconds or HTTP-date.
// Garbage, negative values and past dates mean "no preference" (zero);
// anything beyond an hour is capped.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if isDigits(v) {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n > int64(webhookMaxRetryAfter/time.Second) {
			return webhookMaxRetryAfter // only digits, so the error is overflow
		}
		return time.Duration(n) * time.Second
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0
	}
	d := t.Sub(now)
	switch {
	case d <= 0:
		return 0
	case d > webhookMaxRetryAfter:
		return webhookMaxRetryAfter
	}
	return d
}
