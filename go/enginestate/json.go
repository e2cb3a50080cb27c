package enginestate

import (
	"math"
	"strconv"
	"time"
	"unicode/utf8"
)

// The JSON of an engine: the keys and number forms of `esdump --json`
// (docs/FORMAT.md, "JSON"), byte for byte — serde_json's output, which the
// golden vectors pin.

// JSONKeys are the keys of one engine's object, in order.
var JSONKeys = func() [len(FieldNames) + 5]string {
	var k [len(FieldNames) + 5]string
	k[0] = "engine_id"
	n := 1 + copy(k[1:], FieldNames[:])
	k[n], k[n+1], k[n+2], k[n+3] = "status", "heartbeat_age_ms", "capture_age_ms", "gpu_kv_used_frac"
	return k
}()

// FormatJSON is what `esdump --json` prints for these engines: a
// pretty-printed array (two-space indent) and a newline.
func FormatJSON(engines []EngineState) []byte {
	if len(engines) == 0 {
		return []byte("[]\n")
	}
	b := make([]byte, 0, 700*len(engines))
	b = append(b, "[\n"...)
	for i := range engines {
		if i > 0 {
			b = append(b, ",\n"...)
		}
		b = append(b, "  "...)
		b = engines[i].appendJSON(b, "\n    ", "\n  ", ": ")
	}
	return append(b, "\n]\n"...)
}

// MarshalJSON is the engine's object, compact (encoding/json.Marshaler).
func (e EngineState) MarshalJSON() ([]byte, error) {
	return e.appendJSON(nil, "", "", ":"), nil
}

// appendJSON appends the object: keyPrefix before each key, closePrefix
// before the closing brace, colon between key and value.
func (e *EngineState) appendJSON(b []byte, keyPrefix, closePrefix, colon string) []byte {
	words := e.Snapshot.Words()
	b = append(b, '{')
	for i, key := range JSONKeys {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, keyPrefix...)
		b = appendJSONString(b, key)
		b = append(b, colon...)
		switch {
		case i == 0:
			b = appendJSONString(b, e.EngineID)
		case i <= len(FieldNames):
			b = strconv.AppendUint(b, words[i-1], 10)
		case key == "status":
			b = appendJSONString(b, e.Status.String())
		case key == "heartbeat_age_ms":
			b = appendJSONFloat(b, Millis(e.HeartbeatAge))
		case key == "capture_age_ms":
			b = appendJSONFloat(b, Millis(e.CaptureAge))
		default: // gpu_kv_used_frac
			if frac, ok := e.GPUKVUsedFrac(); ok {
				b = appendJSONFloat(b, frac)
			} else {
				b = append(b, "null"...)
			}
		}
	}
	b = append(b, closePrefix...)
	return append(b, '}')
}

// Millis is a duration in milliseconds with microsecond resolution (the
// duration truncated to whole microseconds), as in the JSON.
func Millis(d time.Duration) float64 {
	return float64(d.Microseconds()) / 1000.0
}

// appendJSONFloat appends f as serde_json prints an f64: the shortest
// digits that read back to f (as strconv finds them), laid out the way
// serde_json's float formatter does — plain decimals with ".0" for
// integral values when the decimal point falls within 16 digits, "0.000ddd"
// down to 1e-5, otherwise "d.ddde+N" / "de-N". NaN and infinities are null.
func appendJSONFloat(b []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return append(b, "null"...)
	}
	if f == 0 {
		if math.Signbit(f) {
			return append(b, "-0.0"...)
		}
		return append(b, "0.0"...)
	}
	var scratch [32]byte
	s := strconv.AppendFloat(scratch[:0], f, 'e', -1, 64) // -d.ddde±XX
	if s[0] == '-' {
		b = append(b, '-')
		s = s[1:]
	}
	e := 0
	for i := range s {
		if s[i] == 'e' {
			exp, _ := strconv.Atoi(string(s[i+1:]))
			e = exp
			s = s[:i]
			break
		}
	}
	var digitBuf [24]byte
	digits := digitBuf[:0]
	for _, c := range s {
		if c != '.' {
			digits = append(digits, c)
		}
	}
	length := len(digits)
	kk := e + 1 // 10^(kk-1) <= f < 10^kk
	k := kk - length
	switch {
	case 0 <= k && kk <= 16:
		b = append(b, digits...)
		for i := length; i < kk; i++ {
			b = append(b, '0')
		}
		return append(b, ".0"...)
	case 0 < kk && kk <= 16:
		b = append(b, digits[:kk]...)
		b = append(b, '.')
		return append(b, digits[kk:]...)
	case -5 < kk && kk <= 0:
		b = append(b, "0."...)
		for i := kk; i < 0; i++ {
			b = append(b, '0')
		}
		return append(b, digits...)
	}
	b = append(b, digits[0])
	if length > 1 {
		b = append(b, '.')
		b = append(b, digits[1:]...)
	}
	b = append(b, 'e')
	if kk-1 > 0 {
		b = append(b, '+')
	}
	return strconv.AppendInt(b, int64(kk-1), 10)
}

// appendJSONString appends s quoted as serde_json does: `"` and `\` escaped,
// \b \f \n \r \t, other control characters as \u00XX; everything else as is.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			b = utf8.AppendRune(b, r)
			i += size
			continue
		}
		switch c {
		case '"':
			b = append(b, `\"`...)
		case '\\':
			b = append(b, `\\`...)
		case '\b':
			b = append(b, `\b`...)
		case '\f':
			b = append(b, `\f`...)
		case '\n':
			b = append(b, `\n`...)
		case '\r':
			b = append(b, `\r`...)
		case '\t':
			b = append(b, `\t`...)
		default:
			if c < 0x20 {
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			} else {
				b = append(b, c)
			}
		}
		i++
	}
	return append(b, '"')
}
