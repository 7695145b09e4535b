package dev.gin4j.cli;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.zip.CRC32;
import java.util.zip.Deflater;

/**
 * A small RGB canvas written as PNG with java.base only (the GPU-host bundle carries no AWT):
 * lines, filled rectangles and text in a built-in 5x7 pixel font.
 */
final class Png {
    private final int width, height;
    private final byte[] rgb;

    Png(int width, int height) {
        this.width = width;
        this.height = height;
        this.rgb = new byte[width * height * 3];
        java.util.Arrays.fill(rgb, (byte) 255);
    }

    void pixel(int x, int y, int color) {
        if (x < 0 || y < 0 || x >= width || y >= height) return;
        int i = (y * width + x) * 3;
        rgb[i] = (byte) (color >> 16);
        rgb[i + 1] = (byte) (color >> 8);
        rgb[i + 2] = (byte) color;
    }

    void rect(int x, int y, int w, int h, int color) {
        for (int j = y; j < y + h; j++) for (int i = x; i < x + w; i++) pixel(i, j, color);
    }

    /** Bresenham line, {@code thick} pixels wide. */
    void line(int x0, int y0, int x1, int y1, int color, int thick) {
        int dx = Math.abs(x1 - x0), dy = -Math.abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1, err = dx + dy;
        while (true) {
            rect(x0 - thick / 2, y0 - thick / 2, thick, thick, color);
            if (x0 == x1 && y0 == y1) break;
            int e2 = 2 * err;
            if (e2 >= dy) { err += dy; x0 += sx; }
            if (e2 <= dx) { err += dx; y0 += sy; }
        }
    }

    // 5x7 glyphs, one string of 7 rows x 5 columns per character ('#' = ink)
    private static final String CHARS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ.-/()x:% ";
    private static final String[] GLYPHS = {
            " ### #   ##  ### # ##   ##   # ### ", "  #   ##    #    #    #    #   ### ", " ### #   #    #   #   #   #    #####", "#####   #   #     #    ##   # ### ",
            "   #   ##  # # #  # #####   #    # ", "######    ####     #    ##   # ### ", "  ##  #   #    #### #   ##   # ### ", "#####    #   #   #   #    #    #    ",
            " ### #   ##   # ### #   ##   # ### ", " ### #   ##   # ####    #   #  ##  ", " ### #   ##   #######   ##   ##   #", "#### #   ##   ##### #   ##   ##### ",
            " ### #   ##    #    #    #   # ### ", "#### #   ##   ##   ##   ##   ##### ", "######    #    #### #    #    #####", "######    #    #### #    #    #    ",
            " ### #   ##    # ####   ##   # ####", "#   ##   ##   #######   ##   ##   #", " ###   #    #    #    #    #   ### ", "  ###   #    #    #    ## #  #  ## ",
            "#   ##  # # #  ##   # #  #  # #   #", "#    #    #    #    #    #    #####", "#   ### ## # ##   ##   ##   ##   #", "#   ##   ###  ## # ##  ###   ##   #",
            " ### #   ##   ##   ##   ##   # ### ", "#### #   ##   ##### #    #    #    ", " ### #   ##   ##   ## # ##  #  ## #", "#### #   ##   ##### # #  #  # #   #",
            " ####    #     ###     #    #####  ", "#####  #    #    #    #    #    #  ", "#   ##   ##   ##   ##   ##   # ### ", "#   ##   ##   ##   ##   # # #   #  ",
            "#   ##   ##   ## # ## # ## # # # # ", "#   ##   # # #   #   # # #   ##   #", "#   ##   # # #   #    #    #    #  ", "#####    #   #   #   #   #    #####",
            "                              ##   ", "               ###                ", "    #   #   #   #   #   #    #     ", "   #   #   #    #    #     #     # ",
            " #     #     #    #    #   #   #   ", "          #   # # #   #   # # #   #", "      ##   ##        ##   ##      ", "##   ##  #   #   #   #  ##   ##   ", "                                   "};

    /** Draws text with its top-left corner at (x, y); {@code scale} enlarges the 5x7 font. */
    void text(int x, int y, String s, int color, int scale) {
        String u = s.toUpperCase(java.util.Locale.ROOT);
        for (int c = 0; c < u.length(); c++) {
            int g = CHARS.indexOf(u.charAt(c));
            if (g < 0) g = CHARS.length() - 1;
            String glyph = GLYPHS[g];
            for (int row = 0; row < 7; row++)
                for (int col = 0; col < 5; col++)
                    if (row * 5 + col < glyph.length() && glyph.charAt(row * 5 + col) == '#') rect(x + (c * 6 + col) * scale, y + row * scale, scale, scale, color);
        }
    }

    void write(Path file) throws IOException {
        ByteArrayOutputStream raw = new ByteArrayOutputStream();
        for (int y = 0; y < height; y++) {
            raw.write(0); // filter: none
            raw.write(rgb, y * width * 3, width * 3);
        }
        Deflater def = new Deflater(Deflater.BEST_COMPRESSION);
        def.setInput(raw.toByteArray());
        def.finish();
        ByteArrayOutputStream z = new ByteArrayOutputStream();
        byte[] buf = new byte[65536];
        while (!def.finished()) z.write(buf, 0, def.deflate(buf));
        def.end();
        ByteArrayOutputStream png = new ByteArrayOutputStream();
        png.write(new byte[] {(byte) 0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'});
        chunk(png, "IHDR", ByteBuffer.allocate(13).putInt(width).putInt(height).put((byte) 8).put((byte) 2).put((byte) 0).put((byte) 0).put((byte) 0).array());
        chunk(png, "IDAT", z.toByteArray());
        chunk(png, "IEND", new byte[0]);
        Files.write(file, png.toByteArray());
    }

    private static void chunk(ByteArrayOutputStream out, String type, byte[] data) throws IOException {
        out.write(ByteBuffer.allocate(4).putInt(data.length).array());
        byte[] t = type.getBytes(java.nio.charset.StandardCharsets.US_ASCII);
        out.write(t);
        out.write(data);
        CRC32 crc = new CRC32();
        crc.update(t);
        crc.update(data);
        out.write(ByteBuffer.allocate(4).putInt((int) crc.getValue()).array());
    }
}
