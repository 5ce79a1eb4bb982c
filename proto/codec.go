package proto

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Line encodes r as one request line ('\n'-terminated).
func (r *Request) Line() []byte {
	b, err := json.Marshal(r)
	if err != nil {
		panic(err) // a Request always encodes
	}
	return append(b, '\n')
}

// Line encodes r as one answer line ('\n'-terminated).
func (r *Response) Line() []byte {
	b, err := json.Marshal(r)
	if err != nil {
		panic(err)
	}
	return append(b, '\n')
}

// DecodeRequest parses one request line (with or without its '\n')
// strictly: UTF-8 (no escaped lone surrogate), one JSON object, no unknown field, no trailing data, then
// Check. Errors are EINVAL *Errors.
func DecodeRequest(line []byte) (Request, error) {
	var r Request
	if err := checkText(line); err != nil {
		return r, err
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return r, Errorf(EINVAL, "malformed request: %v", err)
	}
	if dec.More() {
		return r, Errorf(EINVAL, "malformed request: data after the JSON object")
	}
	if err := r.Check(); err != nil {
		return r, err
	}
	return r, nil
}

// DecodeResponse parses one answer line. Unknown fields are ignored (a
// newer daemon may add some); an answer that is not an object, or an OK
// answer whose chunks are not all positive, is an EPROTO error.
func DecodeResponse(line []byte) (Response, error) {
	var r Response
	if err := json.Unmarshal(line, &r); err != nil {
		return r, Errorf(EPROTO, "bad answer %.200q: %v", line, err)
	}
	check := func(g *Grant) error {
		for i, c := range g.Chunks {
			if c.Len <= 0 {
				return Errorf(EPROTO, "bad answer: chunk %d has length %d", i, c.Len)
			}
		}
		if g.Size < 0 {
			return Errorf(EPROTO, "bad answer: size %d", g.Size)
		}
		return nil
	}
	if err := check(&r.Grant); err != nil {
		return r, err
	}
	for i := range r.Files {
		if err := check(&r.Files[i].Grant); err != nil {
			return r, fmt.Errorf("file %d: %w", i, err)
		}
	}
	return r, nil
}
