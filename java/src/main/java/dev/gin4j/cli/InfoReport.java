package dev.gin4j.cli;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;

/**
 * What {@code gin4j info} found, kept twice as it is gathered: as lines of text and as a JSON
 * tree ({@code info --json}). Each fact is added once, with its key and value for JSON and its line
 * (or none) for the text, so the two forms cannot drift apart. Keys are snake_case; values are
 * strings, numbers, booleans, null, lists and maps.
 */
final class InfoReport {
    private final Map<String, Object> root = new LinkedHashMap<>();
    private final StringBuilder text = new StringBuilder();

    /** A text-only line (a blank line between sections, a closing hint). */
    InfoReport line(String line) {
        text.append(line).append('\n');
        return this;
    }

    /** A top-level object under {@code key}, headed by {@code headline} in the text (null: none). */
    Section section(String key, String headline) {
        if (headline != null) line(headline);
        Map<String, Object> values = new LinkedHashMap<>();
        root.put(key, values);
        return new Section(values);
    }

    /** A top-level list of objects under {@code key} (devices, say). */
    List<Map<String, Object>> list(String key) {
        List<Map<String, Object>> items = new ArrayList<>();
        root.put(key, items);
        return items;
    }

    /** One object of the report: facts, with their text lines. */
    final class Section {
        private final Map<String, Object> values;

        private Section(Map<String, Object> values) { this.values = values; }

        /** A fact: {@code key: value} in JSON, {@code line} in the text (null: JSON only). */
        Section put(String key, Object value, String line) {
            values.put(key, value);
            if (line != null) InfoReport.this.line(line);
            return this;
        }

        /** A line of free text: appended to this object's {@code key} list in JSON and printed as {@code prefix + note}. */
        @SuppressWarnings("unchecked")
        Section note(String key, String prefix, String note) {
            ((List<Object>) values.computeIfAbsent(key, k -> new ArrayList<>())).add(note);
            InfoReport.this.line(prefix + note);
            return this;
        }

        /** A nested object under {@code key}, with no line of its own. */
        Section child(String key) {
            Map<String, Object> nested = new LinkedHashMap<>();
            values.put(key, nested);
            return new Section(nested);
        }
    }

    String text() { return text.toString(); }

    String json() {
        StringBuilder sb = new StringBuilder();
        write(sb, root, "");
        return sb.append('\n').toString();
    }

    private static void write(StringBuilder sb, Object v, String indent) {
        switch (v) {
            case null -> sb.append("null");
            case String s -> quote(sb, s);
            case Boolean b -> sb.append(b);
            case Double d -> sb.append(Double.isFinite(d) ? String.format(Locale.ROOT, "%.3f", d) : "null");
            case Number n -> sb.append(n);
            case Map<?, ?> m -> {
                if (m.isEmpty()) { sb.append("{}"); return; }
                sb.append("{\n");
                int i = 0;
                for (Map.Entry<?, ?> e : m.entrySet()) {
                    sb.append(indent).append("  ");
                    quote(sb, e.getKey().toString());
                    sb.append(": ");
                    write(sb, e.getValue(), indent + "  ");
                    sb.append(++i < m.size() ? ",\n" : "\n");
                }
                sb.append(indent).append('}');
            }
            case List<?> l -> {
                if (l.isEmpty()) { sb.append("[]"); return; }
                sb.append("[\n");
                for (int i = 0; i < l.size(); i++) {
                    sb.append(indent).append("  ");
                    write(sb, l.get(i), indent + "  ");
                    sb.append(i + 1 < l.size() ? ",\n" : "\n");
                }
                sb.append(indent).append(']');
            }
            default -> quote(sb, v.toString());
        }
    }

    private static void quote(StringBuilder sb, String s) {
        sb.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"' -> sb.append("\\\"");
                case '\\' -> sb.append("\\\\");
                case '\n' -> sb.append("\\n");
                case '\r' -> sb.append("\\r");
                case '\t' -> sb.append("\\t");
                default -> {
                    if (c < 0x20) sb.append(String.format(Locale.ROOT, "\\u%04x", (int) c));
                    else sb.append(c);
                }
            }
        }
        sb.append('"');
    }
}
