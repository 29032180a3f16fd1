package payment

// DecodePlainPayload is decodePlainPayload, for the tests that check which
// payloads take the path without encoding/json.
var DecodePlainPayload = decodePlainPayload
