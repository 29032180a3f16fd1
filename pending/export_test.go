package pending

// AsGivenHash is the payload hash builds before numbers were hashed as
// stored computed for in (its numbers as given), for tests that write a
// key as such a build did.
func AsGivenHash(p *Producer, in Instruction) ([]byte, error) {
	pr, err := p.prepare(in)
	if pr.asGivenHash == nil {
		return pr.hash, err
	}
	return pr.asGivenHash, err
}

// PayloadHashOf is the payload hash an enqueue of in compares with its
// key's.
func PayloadHashOf(p *Producer, in Instruction) ([]byte, error) {
	pr, err := p.prepare(in)
	return pr.hash, err
}

// SetMaxBatchPayloadBytes lowers p's MaxBatchPayloadBytes, for tests of
// the limit that need not send 64 MiB.
func SetMaxBatchPayloadBytes(p *Producer, n int) { p.maxBatchPayload = n }

// StoredSizeOf is the size of in's payload as stored, which the payload
// limits count.
func StoredSizeOf(p *Producer, in Instruction) (int, error) {
	pr, err := p.prepare(in)
	return pr.size, err
}
