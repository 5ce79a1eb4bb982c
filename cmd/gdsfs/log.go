package main

import (
	"os"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/term"

	"github.com/gdsfs/gdsfs/internal/config"
)

// newLogger logs to log.file, or stderr: console text on a terminal (or
// when asked), JSON otherwise.
func newLogger(c config.Log) (*zap.Logger, error) {
	level, err := zapcore.ParseLevel(c.Level)
	if err != nil {
		return nil, err
	}
	tty := c.File == "" && term.IsTerminal(int(os.Stderr.Fd()))
	console := c.Format == "console" || (c.Format == "auto" && tty)
	var zc zap.Config
	if console {
		zc = zap.NewDevelopmentConfig()
		zc.Development = false
		zc.EncoderConfig.EncodeLevel = zapcore.CapitalColorLevelEncoder
		if !tty {
			zc.EncoderConfig.EncodeLevel = zapcore.CapitalLevelEncoder
		}
	} else {
		zc = zap.NewProductionConfig()
		zc.Sampling = nil
	}
	zc.Level = zap.NewAtomicLevelAt(level)
	zc.DisableStacktrace = true
	zc.OutputPaths = []string{"stderr"}
	if c.File != "" {
		zc.OutputPaths = []string{c.File}
	}
	return zc.Build()
}
