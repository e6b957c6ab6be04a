package logging

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestScopedLevelsChangeAtRunTime(t *testing.T) {
	levels, err := ParseLevels("default:warn,ads:debug")
	require.NoError(t, err)
	var buf bytes.Buffer
	log := New(&buf, levels)
	log.With("scope", "ads").Debug("ads debug")
	log.With("scope", "filedir").Info("filedir info")
	assert.Contains(t, buf.String(), "ads debug")
	assert.NotContains(t, buf.String(), "filedir info")

	rec := httptest.NewRecorder()
	levels.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPut, "/debug/logging?scope=filedir&level=info", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	log.With("scope", "filedir").Info("now visible")
	assert.Contains(t, buf.String(), "now visible")

	_, err = ParseLevels("ads:loud")
	assert.ErrorContains(t, err, "loud")
}
